"""Untrusted torch checkpoints stay inert (hypothesis): loaders import and call nothing a checkpoint names."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

import lossscale.torch as lst
from tests import properties as props


def check(data) -> None:
    module, class_name = data.draw(props.hostile_names(), label="names")
    policy = {"class_name": class_name, "config": {"initial_loss_scale": 8.0}}
    if data.draw(st.booleans(), label="with module"):
        policy.update(module=module, registered_name=class_name)
    opt = lst.LossScaleOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1))
    saved = opt.state_dict()
    saved["lossscale"]["loss_scale" if "loss_scale" in saved["lossscale"] else "policy"] = policy
    shared = lst.SharedLossScale("dynamic")
    shared_saved = {**shared.state_dict()}
    shared_saved[next(k for k in shared_saved if k != "state")] = policy
    scaler = lst.GradScaler("cpu")
    scaler_saved = scaler.state_dict()
    scaler_saved["lossscale"]["policy"] = policy
    props.run_inert([module], [class_name], (
        lambda: opt.load_state_dict(saved),
        lambda: shared.load_state_dict(shared_saved),
        lambda: scaler.load_state_dict(scaler_saved),
        lambda: lst.LossScaleOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1), policy),
    ))


@props.fast(40)
@given(st.data())
def test_loaders_import_and_call_nothing_named(data):
    check(data)


@props.slow(40)
@given(st.data())
def test_loaders_import_and_call_nothing_named_slow(data):
    check(data)
