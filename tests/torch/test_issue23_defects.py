"""Regression tests for issue 23's torch defects (2, 3, 4, 7, 9) and the removal of check="backward".

Each fails on c0ad0d1: custom policies could not be pickled or reloaded (2), GradScaler refused a
growth_interval above 2**31 - 1 and suggested growth_interval=2 (3), a GradScaler holding a CUDA event in its
stall guard could not be pickled (4), HostSyncCounter had no ``source``/``scalar_reads`` and claimed to count
every sync (7), and GradScaler.scale() named get_scaled_loss() (9).
"""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
import torch

import lossscale
from lossscale.torch import GradScaler, HostSyncCounter, LossScaleOptimizer, SharedLossScale


@dataclasses.dataclass(frozen=True)
class HalvingScale(lossscale.DynamicLossScale):
    """A user's own policy class (defect 2)."""


def _custom() -> HalvingScale:
    return HalvingScale(initial_loss_scale=64.0, increment_period=3)


def _stepped(opt: LossScaleOptimizer, w: torch.nn.Parameter) -> None:
    w.grad = torch.full((2,), float(opt.loss_scale))
    opt.step()


# ------------------------------------------------------------ defect 2: custom LossScale subclasses


@pytest.mark.parametrize("copier", [copy.deepcopy, lambda o: pickle.loads(pickle.dumps(o))], ids=["deepcopy", "pickle"])
def test_optimizer_with_a_custom_policy_pickles_and_deep_copies(copier):
    w = torch.nn.Parameter(torch.ones(2))
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1), _custom())
    _stepped(opt, w)
    w.grad = torch.full((2,), float("inf"))
    opt.step()
    clone = copier(opt)
    assert type(clone.loss_scale_policy) is HalvingScale
    assert clone.loss_scale_policy == opt.loss_scale_policy
    assert float(clone.loss_scale) == float(opt.loss_scale) == 32.0
    assert int(clone.skipped_steps) == 1 and int(clone.consecutive_skips) == 1


@pytest.mark.parametrize("copier", [copy.deepcopy, lambda o: pickle.loads(pickle.dumps(o))], ids=["deepcopy", "pickle"])
def test_shared_scale_with_a_custom_policy_pickles_and_deep_copies(copier):
    shared = SharedLossScale(_custom())
    clone = copier(shared)
    assert type(clone.policy) is HalvingScale and float(clone.loss_scale) == 64.0


def test_load_state_dict_of_its_own_state_dict_with_a_custom_policy():
    w = torch.nn.Parameter(torch.ones(2))
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1), _custom())
    _stepped(opt, w)
    opt.load_state_dict(opt.state_dict())  # the class in use counts as given
    assert type(opt.loss_scale_policy) is HalvingScale and int(opt.dynamic_counter) == 1


def test_a_fresh_optimizer_loads_a_custom_policy_only_through_custom_objects():
    w = torch.nn.Parameter(torch.ones(2))
    saved = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1), _custom()).state_dict()
    fresh = LossScaleOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1))
    with pytest.raises(ValueError, match=r"custom_objects=\{'HalvingScale': HalvingScale\}") as info:
        fresh.load_state_dict(saved)
    assert "pass what state_dict() returned" not in str(info.value)
    assert type(fresh.loss_scale_policy) is lossscale.DynamicLossScale  # nothing changed
    fresh.load_state_dict(saved, custom_objects={"HalvingScale": HalvingScale})
    assert type(fresh.loss_scale_policy) is HalvingScale and float(fresh.loss_scale) == 64.0


def test_shared_scale_state_dict_round_trip_with_a_custom_policy():
    shared = SharedLossScale(_custom())
    other = SharedLossScale()
    other.load_state_dict(shared.state_dict(), custom_objects={"HalvingScale": HalvingScale})
    assert other.policy == shared.policy
    assert "policy" in shared.state_dict() and "loss_scale" not in shared.state_dict()


def test_a_checkpoint_naming_an_unknown_class_imports_nothing():
    w = torch.nn.Parameter(torch.ones(2))
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1))
    sd = opt.state_dict()
    sd["lossscale"]["policy"] = {"class_name": "os.system", "config": {}}
    with pytest.raises(ValueError, match="No class is imported by name"):
        opt.load_state_dict(sd)


# ------------------------------------------------------------ defect 3: growth_interval above 2**31 - 1


def test_gradscaler_accepts_a_huge_growth_interval_saturating_it():
    scaler = GradScaler("cpu", init_scale=8.0, growth_interval=2**40)
    assert scaler.get_growth_interval() == 2**31 - 1
    scaler.set_growth_interval(10**12)
    assert scaler.get_growth_interval() == 2**31 - 1
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    for _ in range(3):
        scaler.scale(w.sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert scaler.get_scale() == 8.0  # never grows: torch's fixed-scale idiom


def test_gradscaler_loads_a_torch_state_dict_with_a_huge_growth_interval():
    saved = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=2**40).state_dict()
    scaler = GradScaler("cpu")
    scaler.load_state_dict(saved)
    assert scaler.get_scale() == 4.0 and scaler.get_growth_interval() == 2**31 - 1


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-5, ValueError), (2.5, TypeError), (True, TypeError)])
def test_a_bad_growth_interval_suggests_a_sensible_value(bad, error):
    with pytest.raises(error, match="growth_interval") as info:
        GradScaler("cpu", growth_interval=bad)
    assert "growth_interval=2000" in str(info.value)
    assert "growth_interval=2." not in str(info.value)


# ------------------------------------------------------------ defect 4: GradScaler pickling with a stall guard


class _Unpicklable:
    """Stands in for a CUDA Event (which this CPU machine cannot make)."""

    def __reduce__(self):
        raise TypeError("cannot pickle 'Event' object")


@pytest.mark.parametrize("copier", [copy.deepcopy, lambda o: pickle.loads(pickle.dumps(o))], ids=["deepcopy", "pickle"])
def test_gradscaler_with_max_consecutive_skips_pickles_after_a_step_holding_an_event(copier):
    scaler = GradScaler("cpu", init_scale=8.0, max_consecutive_skips=3)
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler.scale(w.sum()).backward()
    scaler.step(opt)
    scaler.update()
    scaler._diagnostics.guard._in_flight = (torch.zeros(2), _Unpicklable())  # what a CUDA step leaves there
    with pytest.raises(TypeError):
        pickle.dumps(_Unpicklable())
    clone = copier(scaler)
    assert clone.get_scale() == 8.0 and clone.state_dict() == scaler.state_dict()
    assert clone._diagnostics.guard.limit == 3 and clone._diagnostics.guard._in_flight is None


def test_gradscaler_pickles_a_custom_policy_through_its_record():
    scaler = GradScaler("cpu", init_scale=8.0)
    scaler._owner.set_policy(HalvingScale(8.0, 5, backoff_factor=0.5))
    clone = pickle.loads(pickle.dumps(scaler))
    assert type(clone.loss_scale_policy) is HalvingScale


# ------------------------------------------------------------ defect 7: what HostSyncCounter sees


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU counting rule")
def test_host_sync_counter_on_cpu_counts_scalar_reads_only_as_its_docstring_says():
    t = torch.arange(4.0)
    seen = {}
    for name, read in [("item", lambda: t.sum().item()), ("bool", lambda: bool(t.sum() > 0)),
                       ("float", lambda: float(t.sum())), ("int", lambda: int(t.sum())),
                       ("tolist", lambda: t.tolist()), ("cpu", lambda: t.cpu()), ("mask", lambda: t[t > 1]),
                       ("nonzero", lambda: t.nonzero())]:
        with HostSyncCounter() as syncs:
            read()
        seen[name] = syncs.count
        assert syncs.source == "scalar_reads" and syncs.count == syncs.scalar_reads
    assert seen == {"item": 1, "bool": 1, "float": 1, "int": 1, "tolist": 0, "cpu": 0, "mask": 0, "nonzero": 0}
    doc = HostSyncCounter.__doc__
    for claim in ("set_sync_debug_mode", "cannot see", ".tolist()", "boolean-mask", "other threads"):
        assert claim in doc


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: torch's sync debug mode")
def test_host_sync_counter_on_cuda_counts_what_torch_sync_debug_mode_counts():
    t = torch.arange(4.0, device="cuda")
    with HostSyncCounter() as syncs:
        t.cpu()
        t[t > 1]
        t.tolist()
    assert syncs.source == "cuda_sync_debug_mode" and syncs.count >= 3
    assert torch.cuda.get_sync_debug_mode() == 0


# ------------------------------------------------------------ defect 9: GradScaler.scale()'s error


def test_gradscaler_scale_error_names_its_own_api():
    with pytest.raises(TypeError, match=r"GradScaler\.scale\(\)") as info:
        GradScaler("cpu").scale(torch.ones((), dtype=torch.int64))
    assert "get_scaled_loss" not in str(info.value)


# ------------------------------------------------------------ check="backward" is gone


@pytest.mark.parametrize("check", ["step", "backward", "steps"])
def test_check_is_refused_as_removed_naming_the_fix(check):
    inner = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))], fused=True)
    with pytest.raises(TypeError, match="was removed") as info:
        LossScaleOptimizer(inner, check=check)
    assert "Drop the check argument" in str(info.value)


# ------------------------------------------------------------ the vocabulary on the torch side


def test_optimizer_takes_the_policy_refinements_and_shows_them():
    w = torch.nn.Parameter(torch.ones(2))
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1), initial_scale=8.0, dynamic_growth_steps=5,
                             min_loss_scale=0.5, max_loss_scale=2.0**10, hysteresis=2, max_consecutive_skips=4)
    assert opt.loss_scale_policy == lossscale.DynamicLossScale(8.0, 5, min_loss_scale=0.5, max_loss_scale=2.0**10,
                                                               hysteresis=2)
    assert (opt.min_loss_scale, opt.max_loss_scale, opt.hysteresis, opt.max_consecutive_skips) == (0.5, 1024.0, 2, 4)
    fixed = LossScaleOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1), 16)
    assert (fixed.min_loss_scale, fixed.max_loss_scale, fixed.hysteresis) == (None, None, None)


def test_consecutive_skips_is_this_optimizers_streak():
    w = torch.nn.Parameter(torch.ones(2))
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1), initial_scale=8.0)
    for _ in range(2):
        w.grad = torch.full((2,), float("nan"))
        opt.step()
    assert int(opt.consecutive_skips) == 2 and opt.consecutive_skips.dtype == torch.int32
    _stepped(opt, w)
    assert int(opt.consecutive_skips) == 0 and int(opt.skipped_steps) == 2


def test_shared_scale_takes_the_refinements_and_a_wrapper_refuses_them_beside_it():
    shared = SharedLossScale(min_loss_scale=2.0, hysteresis=3)
    assert shared.policy == lossscale.DynamicLossScale(2**15, 2000, min_loss_scale=2.0, hysteresis=3)
    inner = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    with pytest.raises(ValueError, match=r"drop hysteresis= or give them to SharedLossScale"):
        LossScaleOptimizer(inner, shared, hysteresis=2)


def test_every_torch_record_keys_its_policy_policy_and_older_loss_scale_records_load():
    w = torch.nn.Parameter(torch.ones(2))
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1), initial_scale=8.0)
    _stepped(opt, w)
    sd = opt.state_dict()
    assert "policy" in sd["lossscale"] and "loss_scale" not in sd["lossscale"]
    assert "policy" in SharedLossScale().state_dict()
    assert "policy" in GradScaler("cpu").state_dict()["lossscale"]
    old = copy.deepcopy(sd)
    old["lossscale"]["loss_scale"] = old["lossscale"].pop("policy")  # a checkpoint written before issue 23
    fresh = LossScaleOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1))
    fresh.load_state_dict(old)
    assert float(fresh.loss_scale) == 8.0 and int(fresh.dynamic_counter) == 1


def test_pickling_keeps_a_shared_scale_shared():
    shared = SharedLossScale(initial_scale=8.0)
    a = LossScaleOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1), shared)
    b = LossScaleOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1), shared)
    a2, b2 = pickle.loads(pickle.dumps((a, b)))
    assert a2.shared_loss_scale is b2.shared_loss_scale
    assert isinstance(a2.shared_loss_scale, SharedLossScale) and float(a2.loss_scale) == 8.0


def test_pickling_validates_the_record_as_load_state_dict_does():
    w = torch.nn.Parameter(torch.ones(2))
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=0.1))
    state = opt.__getstate__()
    state["scale"]["state"]["loss_scale"] = "big"
    clone = LossScaleOptimizer.__new__(LossScaleOptimizer)
    with pytest.raises(ValueError, match="Not a lossscale state dict"):
        clone.__setstate__(state)
