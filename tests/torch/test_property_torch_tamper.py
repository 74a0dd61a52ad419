"""Tampered and foreign checkpoints (hypothesis): refused with the object unchanged, or loaded into a valid state.

One field of a real checkpoint (any leaf of the ``"lossscale"`` record, the policy's config included, or any of a
GradScaler's keys) is replaced by a drawn bad value (NaN, +-inf, -1, 0, 1e-45, a string, None, True, a list, a
2-element tensor, 2**40, 1e39, a float64 tensor), deleted, or joined by an extra key. Profiles: tests/properties.py.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import lossscale
import lossscale.torch as lst
from tests import properties as props
from tests.torch.test_property_torch import INNER, SHAPES, set_grads

REFUSED = (TypeError, ValueError)


def leaves(tree, path=()):
    """Every (path, value) below ``tree`` (dicts only; a tensor or a list is a leaf)."""
    if isinstance(tree, dict):
        yield path, tree
        for key, value in tree.items():
            yield from leaves(value, (*path, key))
    else:
        yield path, tree


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def bad_value():
    tensors = st.sampled_from(["float64 0", "int64 2**32", "float64 nan"]).map(
        lambda name: {
            "float64 0": lambda: torch.tensor(0.0, dtype=torch.float64),
            "int64 2**32": lambda: torch.tensor(2**32, dtype=torch.int64),  # wraps to 0 in int32
            "float64 nan": lambda: torch.tensor(math.nan, dtype=torch.float64),
        }[name]()
    )
    return props.bad_values(lambda: torch.ones(2)) | tensors


def tamper(data, record: dict) -> str:
    """Changes one thing in ``record`` (in place); returns a description."""
    paths = [p for p, _ in leaves(record) if p]
    path = data.draw(st.sampled_from(paths), label="path")
    *parent_path, key = path
    parent = record
    for k in parent_path:
        parent = parent[k]
    action = data.draw(st.sampled_from(["replace", "replace", "delete", "extra"]), label="action")
    if action == "delete":
        del parent[key]
    elif action == "extra":
        target = parent if isinstance(parent, dict) else record
        target["from_the_future"] = data.draw(bad_value(), label="extra value")
    else:
        parent[key] = data.draw(bad_value(), label="value")
    return f"{action} {path}"


def counters_ok(*tensors) -> None:
    for t in tensors:
        assert t.dtype == torch.int32 and 0 <= int(t) < 2**31


def stepped(policy, kind, steps, seed_entries):
    params = [torch.nn.Parameter(torch.ones(s)) for s in SHAPES]
    inner = INNER[kind](params)
    opt = lst.LossScaleOptimizer(inner, policy)
    for i in range(steps):
        set_grads(params, i, seed_entries[i % len(seed_entries)], float(opt.loss_scale))
        opt.step()
        opt.zero_grad()
    return params, inner, opt


def optimizer_tamper(data) -> None:
    kind = data.draw(st.sampled_from(sorted(INNER)), label="inner")
    policy = data.draw(props.policies(), label="policy")
    entries = data.draw(props.step_plans(4), label="plan")
    _, _, source = stepped(policy, kind, data.draw(st.integers(0, 3), label="source steps"), entries)
    saved = source.state_dict()
    description = tamper(data, saved["lossscale"])
    params, _, target = stepped(data.draw(props.policies(), label="target policy"), kind, 2, entries)
    before = copy.deepcopy(target.state_dict()), [p.detach().clone() for p in params]
    try:
        target.load_state_dict(saved)
    except REFUSED:
        assert same(before[0], target.state_dict()), description
        assert same(before[1], [p.detach().clone() for p in params])
        return
    # accepted: a valid state that trains on
    assert props.in_bounds(float(target.loss_scale), target.loss_scale_policy), description
    counters_ok(target.skipped_steps, *target.shared_loss_scale.state[1:])
    set_grads(params, 9, None, float(target.loss_scale))
    target.step()
    assert props.in_bounds(float(target.loss_scale), target.loss_scale_policy), description


@props.fast(60)
@given(st.data())
def test_tampered_optimizer_checkpoint_is_refused_or_valid(data):
    optimizer_tamper(data)


@props.slow(60)
@given(st.data())
def test_tampered_optimizer_checkpoint_is_refused_or_valid_slow(data):
    optimizer_tamper(data)


def shared_tamper(data) -> None:
    policy = data.draw(props.policies(), label="policy")
    source = lst.SharedLossScale(policy)
    saved = source.state_dict()
    description = tamper(data, saved)
    target = lst.SharedLossScale(data.draw(props.policies(), label="target policy"))
    before = copy.deepcopy(target.state_dict())
    try:
        target.load_state_dict(saved)
    except REFUSED:
        assert same(before, target.state_dict()), description
        return
    assert props.in_bounds(float(target.loss_scale), target.policy), description
    counters_ok(*target.state[1:])


@props.fast(40)
@given(st.data())
def test_tampered_shared_scale_is_refused_or_valid(data):
    shared_tamper(data)


@props.slow(40)
@given(st.data())
def test_tampered_shared_scale_is_refused_or_valid_slow(data):
    shared_tamper(data)


def gradscaler_tamper(data) -> None:
    source = lst.GradScaler("cpu", init_scale=2.0 ** data.draw(st.integers(0, 20), label="init"),
                            growth_interval=data.draw(st.integers(1, 5), label="interval"))
    saved = source.state_dict()
    description = tamper(data, saved)
    top = data.draw(st.none() | st.sampled_from([2.0**16, 2.0**24]), label="target max")
    target = lst.GradScaler("cpu", **({} if top is None else {"max_loss_scale": top}))
    before = copy.deepcopy(target.state_dict())
    try:
        target.load_state_dict(saved)
    except REFUSED:
        assert same(before, target.state_dict()), description
        return
    after = target.state_dict()
    policy = lossscale.get(after["lossscale"]["policy"])
    assert props.in_bounds(after["scale"], policy), (description, after)
    for value in (after["_growth_tracker"], *(after["lossscale"][k] for k in ("bad_steps", "skipped_steps",
                                                                                 "consecutive_skips"))):
        assert isinstance(value, int) and 0 <= value < 2**31


@props.fast(60)
@given(st.data())
def test_tampered_gradscaler_state_is_refused_or_valid(data):
    gradscaler_tamper(data)


@props.slow(60)
@given(st.data())
def test_tampered_gradscaler_state_is_refused_or_valid_slow(data):
    gradscaler_tamper(data)


# ------------------------------------------------------------------ the examples, one by one


def test_gradscaler_float32_overflow_and_huge_ints_are_value_errors():
    scaler = lst.GradScaler("cpu")
    for value in (1e39, 10**400, math.inf, math.nan):
        saved = scaler.state_dict()
        saved["scale"] = value
        with pytest.raises(ValueError, match="finite in float32"):
            scaler.load_state_dict(saved)
    assert scaler.get_scale() == 2.0**16


@pytest.mark.parametrize("stepped_before_save", [True, False])
@pytest.mark.parametrize("wrapped", [True, False])
def test_another_optimizers_state_dict_is_refused_unchanged(stepped_before_save, wrapped):
    ps = [torch.nn.Parameter(torch.ones(2))]
    sgd = torch.optim.SGD(ps, lr=0.1, momentum=0.9)
    if stepped_before_save:
        ps[0].grad = torch.ones(2)
        sgd.step()
    foreign = lst.LossScaleOptimizer(sgd).state_dict() if wrapped else sgd.state_dict()
    params = [torch.nn.Parameter(torch.ones(2))]
    opt = lst.LossScaleOptimizer(torch.optim.AdamW(params, lr=0.1, fused=True), 8.0)
    params[0].grad = torch.ones(2) * 8
    opt.step()
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(ValueError, match=r"lacks \[.*'betas'.*another kind of optimizer"):
        opt.load_state_dict(foreign)
    assert same(before, opt.state_dict())
    params[0].grad = torch.ones(2) * 8
    opt.step()  # still trains


def test_extra_keys_in_the_record_are_refused_by_name():
    opt = lst.LossScaleOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1))
    saved = opt.state_dict()
    saved["lossscale"]["state"]["future_counter"] = 3
    with pytest.raises(ValueError, match="future_counter"):
        opt.load_state_dict(saved)


@pytest.mark.parametrize("field", ["loss_scale", "good_steps"])
def test_unpickling_a_corrupted_scale_is_refused(field):
    import pickle

    opt = lst.LossScaleOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1), 8.0)
    tensor = getattr(opt.shared_loss_scale.state, field)
    tensor.fill_(math.nan if tensor.is_floating_point() else -5)  # the live state damaged, then pickled
    with pytest.raises(ValueError, match=f"'{field}'"):
        pickle.loads(pickle.dumps(opt))


@pytest.mark.parametrize("field", ["good_steps", "bad_steps", "skipped_steps", "consecutive_skips"])
def test_int64_counters_that_would_wrap_are_refused(field):
    opt = lst.LossScaleOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1))
    saved = opt.state_dict()
    saved["lossscale"]["state"][field] = torch.tensor(2**32, dtype=torch.int64)
    with pytest.raises(ValueError, match=rf"'{field}'\] must be an int in \[0, 2\*\*31 - 1\].*got 4294967296"):
        opt.load_state_dict(saved)
    scale = lst.SharedLossScale("dynamic")
    saved = scale.state_dict()
    saved["state"][field] = torch.tensor(-1, dtype=torch.int64)
    with pytest.raises(ValueError, match=f"'{field}'"):
        scale.load_state_dict(saved)


def test_every_field_of_every_torch_record_with_every_bad_value():
    """Exhaustive companion of the tamper properties: every leaf of each record, each bad value, refused unchanged
    or loaded valid (a count of 0 is a valid count)."""
    values = [*props.BAD_SCALARS, torch.ones(2), torch.tensor(2**32, dtype=torch.int64),
              torch.tensor(0.0, dtype=torch.float64)]
    policy = lossscale.DynamicLossScale(2.0**10, 3, max_loss_scale=2.0**12)
    _, _, opt = stepped(policy, "fused", 3, [None, ("nan", 1)])
    scaler = lst.GradScaler("cpu", init_scale=2.0**10, max_loss_scale=2.0**12)
    shared = lst.SharedLossScale(policy)
    for target, saved, root in ((opt, opt.state_dict(), "lossscale"), (shared, shared.state_dict(), None),
                                (scaler, scaler.state_dict(), None)):
        record = saved[root] if root else saved
        for path, _ in [p for p in leaves(record) if p[0]]:
            for value in values:
                tampered = copy.deepcopy(saved)
                parent = tampered[root] if root else tampered
                for key in path[:-1]:
                    parent = parent[key]
                parent[path[-1]] = value
                before = copy.deepcopy(target.state_dict())
                try:
                    target.load_state_dict(tampered)
                except REFUSED:
                    assert same(before, target.state_dict()), (path, value)
                    continue
                scale = float(target.get_scale() if target is scaler else target.loss_scale)
                bounds = lossscale.get(target.state_dict()["lossscale"]["policy"]) if target is scaler else policy
                assert props.in_bounds(scale, bounds), (type(target).__name__, path, value, scale)
                target.load_state_dict(saved)
