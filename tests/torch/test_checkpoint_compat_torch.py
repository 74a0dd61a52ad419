"""torch checkpoints written by every release (tests/compat/fixtures/<version>/) load with today's code and train on
exactly as an uninterrupted run does: state dicts of LossScaleOptimizer, SharedLossScale and GradScaler, and pickles
(torch.save of the whole objects, and pickle.dumps) of LossScaleOptimizer and GradScaler."""

from __future__ import annotations

import pickle

import pytest
import torch

import lossscale.torch as lst
from tests.compat import recipes
from tests.compat.compare import VERSIONS, assert_same, at_save, fixture

AFTER = range(recipes.SAVED_AFTER, recipes.TOTAL_STEPS)
EVERYTHING = range(recipes.TOTAL_STEPS)


def load_pickle(path):
    if path.suffix == ".pkl":
        return pickle.loads(path.read_bytes())
    return torch.load(path, weights_only=False)


def check_at_save(version, name, scale, skipped=None):
    recorded = at_save(version, name)
    assert float(scale) == recorded["loss_scale"] == recipes.AT_SAVE["loss_scale"]
    if skipped is not None:
        assert int(skipped) == recorded["skipped_steps"] == recipes.AT_SAVE["skipped_steps"]


def check_end(scale, skipped):
    assert (float(scale), int(skipped)) == (recipes.AT_END["loss_scale"], recipes.AT_END["skipped_steps"])


@pytest.fixture(scope="module")
def uninterrupted_optimizer():
    model = recipes.torch_model()
    opt = recipes.torch_optimizer(lst, model)
    recipes.torch_optimizer_steps(model, opt, EVERYTHING)
    check_end(opt.loss_scale, opt.skipped_steps)
    return model, opt


@pytest.fixture(scope="module")
def uninterrupted_gradscaler():
    model = recipes.torch_model()
    scaler, sgd = recipes.torch_gradscaler(lst, model)
    recipes.torch_gradscaler_steps(model, scaler, sgd, EVERYTHING)
    check_end(scaler.get_scale(), scaler.skipped_steps)
    return model, scaler, sgd


def known_here(state, reference):
    """``state`` with each of its ``param_groups`` limited to the keys of ``reference``'s groups.

    The fixtures were written with a newer torch, whose optimizers define hyperparameters an older torch's do
    not (Adam's ``decoupled_weight_decay`` from torch 2.6): ``load_state_dict`` keeps such a key in the group and
    the older step never reads it. Every other entry is compared whole.
    """
    if isinstance(state, dict) and isinstance(reference, dict):
        out = {}
        for key, value in state.items():
            if key == "param_groups" and isinstance(reference.get(key), list):
                out[key] = [{k: v for k, v in group.items() if k in ref} for group, ref in zip(value, reference[key])]
            else:
                out[key] = known_here(value, reference.get(key))
        return out
    return state


#: Weights and moments trained on the machine that wrote a fixture may differ in the last bits from this machine's
#: (torch picks AVX2 or AVX-512 kernels by CPU); the scale, the counters and every integer stay exact.
ULPS = 1e-5


def same_run(model, opt, reference):
    ref_model, ref_opt = reference
    assert_same(model.state_dict(), ref_model.state_dict(), "model", rtol=ULPS)
    ref_state = ref_opt.state_dict()  # scale, counters, policy, inner state
    assert_same(known_here(opt.state_dict(), ref_state), ref_state, "optimizer", rtol=ULPS)
    assert (float(opt.loss_scale), int(opt.skipped_steps), int(opt.consecutive_skips)) == (
        float(ref_opt.loss_scale), int(ref_opt.skipped_steps), int(ref_opt.consecutive_skips))


@pytest.mark.parametrize("version", VERSIONS)
def test_optimizer_state_dict_resumes(version, uninterrupted_optimizer):
    saved = torch.load(fixture(version, "torch_optimizer.pt"))  # weights_only: a state dict needs no pickle
    model = recipes.torch_model()
    model.load_state_dict(saved["model"])
    opt = recipes.torch_optimizer(lst, model)
    opt.load_state_dict(saved["optimizer"])
    check_at_save(version, "torch_optimizer.pt", opt.loss_scale, opt.skipped_steps)
    recipes.torch_optimizer_steps(model, opt, AFTER)
    same_run(model, opt, uninterrupted_optimizer)


@pytest.mark.parametrize("name", ["torch_optimizer_pickle.pt", "torch_optimizer.pkl"])
@pytest.mark.parametrize("version", VERSIONS)
def test_pickled_optimizer_resumes(version, name, uninterrupted_optimizer):
    loaded = load_pickle(fixture(version, name))
    model, opt = loaded["model"], loaded["optimizer"]
    assert isinstance(opt, lst.LossScaleOptimizer)
    check_at_save(version, name, opt.loss_scale, opt.skipped_steps)
    recipes.torch_optimizer_steps(model, opt, AFTER)
    same_run(model, opt, uninterrupted_optimizer)


@pytest.mark.parametrize("version", VERSIONS)
def test_shared_loss_scale_state_dicts_resume(version):
    saved = torch.load(fixture(version, "torch_shared.pt"))
    model = recipes.torch_model()
    model.load_state_dict(saved["model"])
    shared, opt_a, opt_b = recipes.torch_shared(lst, model)
    shared.load_state_dict(saved["shared"])
    opt_a.load_state_dict(saved["opt_a"])
    opt_b.load_state_dict(saved["opt_b"])
    check_at_save(version, "torch_shared.pt", shared.loss_scale)
    recipes.torch_shared_steps(model, shared, opt_a, opt_b, AFTER)

    ref_model = recipes.torch_model()
    ref = recipes.torch_shared(lst, ref_model)
    recipes.torch_shared_steps(ref_model, *ref, EVERYTHING)
    assert float(ref[0].loss_scale) == recipes.AT_END["loss_scale"]
    assert_same(model.state_dict(), ref_model.state_dict(), "model", rtol=ULPS)
    for name, mine, theirs in zip(["shared", "opt_a", "opt_b"], [shared, opt_a, opt_b], ref):
        assert_same(known_here(mine.state_dict(), theirs.state_dict()), theirs.state_dict(), name, rtol=ULPS)


def same_gradscaler_run(model, scaler, sgd, reference):
    ref_model, ref_scaler, ref_sgd = reference
    assert_same(model.state_dict(), ref_model.state_dict(), "model", rtol=ULPS)
    assert_same(sgd.state_dict(), ref_sgd.state_dict(), "SGD", rtol=ULPS)
    assert_same(scaler.state_dict(), ref_scaler.state_dict(), "GradScaler")
    assert (float(scaler.get_scale()), int(scaler.skipped_steps)) == (
        float(ref_scaler.get_scale()), int(ref_scaler.skipped_steps))


@pytest.mark.parametrize("version", VERSIONS)
def test_gradscaler_state_dict_resumes(version, uninterrupted_gradscaler):
    saved = torch.load(fixture(version, "torch_gradscaler.pt"))
    model = recipes.torch_model()
    model.load_state_dict(saved["model"])
    scaler, sgd = recipes.torch_gradscaler(lst, model)
    sgd.load_state_dict(saved["optimizer"])
    scaler.load_state_dict(saved["scaler"])
    check_at_save(version, "torch_gradscaler.pt", scaler.get_scale(), scaler.skipped_steps)
    recipes.torch_gradscaler_steps(model, scaler, sgd, AFTER)
    same_gradscaler_run(model, scaler, sgd, uninterrupted_gradscaler)


@pytest.mark.parametrize("name", ["torch_gradscaler_pickle.pt", "torch_gradscaler.pkl"])
@pytest.mark.parametrize("version", VERSIONS)
def test_pickled_gradscaler_resumes(version, name, uninterrupted_gradscaler):
    loaded = load_pickle(fixture(version, name))
    model, scaler, sgd = loaded["model"], loaded["scaler"], loaded["optimizer"]
    assert isinstance(scaler, lst.GradScaler)
    check_at_save(version, name, scaler.get_scale(), scaler.skipped_steps)
    recipes.torch_gradscaler_steps(model, scaler, sgd, AFTER)
    same_gradscaler_run(model, scaler, sgd, uninterrupted_gradscaler)


@pytest.mark.parametrize("version", VERSIONS)
def test_pickles_with_diagnostics_keep_them_and_resume(version):
    loaded = load_pickle(fixture(version, "torch_diagnostics.pkl"))
    opt, scaler = loaded["optimizer"], loaded["scaler"]
    assert [len(opt.history), len(scaler.history)] == at_save(version, "torch_diagnostics.pkl")["history_steps"] == [
        recipes.SAVED_AFTER, recipes.SAVED_AFTER]
    limit = recipes.TORCH_DIAGNOSTICS["max_consecutive_skips"]
    assert opt.max_consecutive_skips == limit
    assert scaler._diagnostics.guard.limit == limit  # GradScaler has no public reader of it
    recipes.torch_optimizer_steps(loaded["model"], opt, AFTER)
    recipes.torch_gradscaler_steps(loaded["model_b"], scaler, loaded["sgd"], AFTER)
    assert opt.last_overflow_report is not None and scaler.last_overflow_report is not None  # step 7 overflowed

    ref_model, ref_model_b = recipes.torch_model(), recipes.torch_model()
    ref_opt = recipes.torch_optimizer(lst, ref_model, **recipes.TORCH_DIAGNOSTICS)
    recipes.torch_optimizer_steps(ref_model, ref_opt, EVERYTHING)
    ref_scaler, ref_sgd = recipes.torch_gradscaler(lst, ref_model_b, **recipes.TORCH_DIAGNOSTICS)
    recipes.torch_gradscaler_steps(ref_model_b, ref_scaler, ref_sgd, EVERYTHING)
    same_run(loaded["model"], opt, (ref_model, ref_opt))
    same_gradscaler_run(loaded["model_b"], scaler, loaded["sgd"], (ref_model_b, ref_scaler, ref_sgd))
    for mine, theirs in [(opt.history, ref_opt.history), (scaler.history, ref_scaler.history)]:
        assert_same([mine.steps, mine.loss_scales, mine.skipped], [theirs.steps, theirs.loss_scales, theirs.skipped])
