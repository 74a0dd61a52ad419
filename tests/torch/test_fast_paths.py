"""The fast paths of issue 3: fused and unfused steps, clipping, syncs, torch.compile.

Scaling by a power of two and unscaling is exact in float32, so on finite
steps a loss-scaled float32 run must give the *same bits* as an unscaled run
of the same optimizer; where the clip factor travels into a fused kernel as
part of ``grad_scale`` the rounding differs, and the tolerance is float32's.
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo as dynamo
from sync_counter import count_syncs

from lossscale.torch import LossScaleOptimizer

ROOT = Path(__file__).resolve().parents[2]
SIZES = (6, 16, 3)

OPTIMIZERS = {
    "adamw-fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
    "adamw-foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "adam-forloop": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
    "sgd-momentum-fused": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, fused=True),
    "sgd-momentum-foreach": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, foreach=True),
    "adagrad-fused": lambda p: torch.optim.Adagrad(p, lr=1e-2, fused=True),
}


FUSED = sorted(k for k in OPTIMIZERS if k.endswith("-fused"))
# (optimizer, check mode): "step" is the one check mode.
KIND_CHECKS = [pytest.param(k, "step", id=f"{k}-step") for k in sorted(OPTIMIZERS)]


def batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(32, 6, generator=gen), torch.randn(32, 3, generator=gen)) for _ in range(n)]


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x), y)


def run_plain(make_model, kind: str, data, clip: float | None = None) -> torch.nn.Module:
    model = make_model(SIZES)
    opt = OPTIMIZERS[kind](model.parameters())
    for x, y in data:
        opt.zero_grad()
        loss_of(model, x, y).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return model


def run_scaled(
    make_model, kind: str, data, clip: float | None = None, inject: set[int] = frozenset(), inject_via: str = "grad",
    **kwargs,
):
    """``inject_via``: "grad" writes an Inf into a gradient after the backward (the hooks do not see it);
    "input" puts one in the batch, so the backward itself makes non-finite gradients."""
    model = make_model(SIZES)
    opt = LossScaleOptimizer(OPTIMIZERS[kind](model.parameters()), **kwargs)
    for i, (x, y) in enumerate(data):
        opt.zero_grad()
        if i in inject and inject_via == "input":
            x = x.clone()
            x[0, 0] = float("inf")
        opt.get_scaled_loss(loss_of(model, x, y)).backward()
        if i in inject and inject_via == "grad":
            model[0].weight.grad[0, 0] = float("inf")
        if clip is not None:
            opt.clip_grad_norm_(clip)
        opt.step()
    return model, opt


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module, exact: bool) -> None:
    for pa, pb in zip(a.parameters(), b.parameters()):
        if exact:
            assert torch.equal(pa, pb)
        else:
            torch.testing.assert_close(pa, pb, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("kind, check", KIND_CHECKS)
def test_finite_steps_give_the_unscaled_runs_bits(make_model, kind, check):
    data = batches(12)
    model, opt = run_scaled(make_model, kind, data, initial_scale=2.0**12, dynamic_growth_steps=5)
    assert_same_weights(model, run_plain(make_model, kind, data), exact=True)
    assert float(opt.loss_scale) == 2.0**14  # grew twice in 12 finite steps
    assert int(opt.skipped_steps) == 0


@pytest.mark.parametrize("inject_via", ["grad", "input"])
@pytest.mark.parametrize("kind, check", KIND_CHECKS)
def test_overflow_step_is_skipped_on_every_path(make_model, kind, check, inject_via):
    data = batches(8)
    model, opt = run_scaled(
        make_model, kind, data, inject={0, 3}, inject_via=inject_via, initial_scale=2.0**12,
        dynamic_growth_steps=100,
    )
    reference = run_plain(make_model, kind, [d for i, d in enumerate(data) if i not in (0, 3)])
    assert_same_weights(model, reference, exact=True)
    assert float(opt.loss_scale) == 2.0**10
    assert int(opt.skipped_steps) == 2
    assert not bool(opt.last_step_skipped)
    inner_state = opt.inner_optimizer.state[model[0].weight]
    if "step" in inner_state:
        assert float(inner_state["step"]) == 6.0


@pytest.mark.parametrize("check", ["step"])
@pytest.mark.parametrize("inject_via", ["grad", "input"])
def test_fused_sgd_skipped_first_step_leaves_no_garbage_momentum(make_model, check, inject_via):
    # torch's fused SGD creates momentum buffers with empty_like on its first step
    # and relies on the kernel to fill them; skipping that step on the device
    # would leave garbage. lossscale decides that one step on the host.
    data = batches(5)
    model, _opt = run_scaled(
        make_model, "sgd-momentum-fused", data, inject={0}, inject_via=inject_via, initial_scale=2.0**8
    )
    assert_same_weights(model, run_plain(make_model, "sgd-momentum-fused", data[1:]), exact=True)


@pytest.mark.parametrize(
    "kind, check, expected",
    [
        ("adamw-fused", "step", 0), ("sgd-momentum-fused", "step", 0), ("adagrad-fused", "step", 0),
        ("adamw-foreach", "step", 1), ("adam-forloop", "step", 1),
    ],
)
def test_host_syncs_per_step(make_model, kind, check, expected):
    model = make_model(SIZES)
    inner = OPTIMIZERS[kind](model.parameters())
    opt = LossScaleOptimizer(inner, initial_scale=2.0**8)
    (x, y), = batches(1)

    def one_step(scaled: bool) -> int:
        opt.zero_grad()
        if scaled:
            opt.get_scaled_loss(loss_of(model, x, y)).backward()
            return count_syncs(opt.step)
        loss_of(model, x, y).backward()
        return count_syncs(inner.step)

    if kind == "adagrad-fused" and not getattr(inner, "_step_supports_amp_scaling", False):
        # torch 2.5's Adagrad(fused=True) does not declare _step_supports_amp_scaling (newer releases do), so
        # lossscale, like torch.amp.GradScaler, unscales its gradients itself: the unfused path's one sync.
        expected = 1
    one_step(True)  # first step: state allocation (and fused SGD's host-decided first step)
    # Adam's non-capturable foreach/for-loop paths read their CPU step counters with .item():
    # count what lossscale adds on top of the inner optimizer's own reads.
    assert one_step(True) - one_step(False) == expected


@pytest.mark.parametrize(
    "kind, check",
    [("adamw-fused", "step"), ("adamw-foreach", "step"), ("sgd-momentum-fused", "step"), ("sgd-momentum-foreach", "step")],
)
def test_clip_grad_norm_matches_torch_clip_of_unscaled_grads(make_model, kind, check):
    data = batches(10)
    model, opt = run_scaled(make_model, kind, data, clip=0.05, initial_scale=2.0**10)
    reference = run_plain(make_model, kind, data, clip=0.05)
    assert_same_weights(model, reference, exact=False)
    assert int(opt.skipped_steps) == 0


@pytest.mark.parametrize("check", ["step"])
def test_clip_grad_norm_returns_the_unscaled_norm_and_costs_no_sync_when_fused(make_model, check):
    model = make_model(SIZES)
    opt = LossScaleOptimizer(torch.optim.AdamW(model.parameters(), fused=True), initial_scale=2.0**10)
    (x, y), = batches(1)
    opt.get_scaled_loss(loss_of(model, x, y)).backward()
    opt.step()  # the first step creates the inner state, and is decided on the host
    opt.zero_grad()
    opt.get_scaled_loss(loss_of(model, x, y)).backward()
    reference_model = copy.deepcopy(model)
    for p, q in zip(reference_model.parameters(), model.parameters()):
        p.grad = q.grad / 2.0**10
    expected = torch.nn.utils.clip_grad_norm_(reference_model.parameters(), 1e9)
    total = {}
    assert count_syncs(lambda: total.setdefault("norm", opt.clip_grad_norm_(0.01))) == 0
    assert count_syncs(opt.step) == 0
    torch.testing.assert_close(total["norm"], expected, rtol=1e-6, atol=0)


def test_clip_grad_norm_on_a_non_finite_gradient_skips_the_step(make_model):
    model = make_model(SIZES)
    before = copy.deepcopy(model)
    opt = LossScaleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), initial_scale=8.0)
    (x, y), = batches(1)
    opt.get_scaled_loss(loss_of(model, x, y)).backward()
    model[2].bias.grad[0] = float("nan")
    norm = opt.clip_grad_norm_(1.0)
    assert math.isnan(float(norm))
    opt.step()
    assert_same_weights(model, before, exact=True)
    assert float(opt.loss_scale) == 4.0


def test_a_scaled_norm_past_float32_range_counts_as_overflow():
    # Every element is finite, but the scaled gradients' 2-norm is not representable:
    # the step is skipped and the scale backs off, after which the norm fits.
    w = torch.nn.Parameter(torch.zeros(4))
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=1.0), initial_scale=2.0**20)
    w.grad = torch.full((4,), 1e32)  # scaled values 1e32: finite; their squares overflow float32
    assert torch.isfinite(w.grad).all()
    norm = opt.clip_grad_norm_(1.0)
    assert math.isinf(float(norm))
    opt.step()
    assert torch.equal(w.detach(), torch.zeros(4))
    assert float(opt.loss_scale) == 2.0**19


def test_fused_float16_parameters_are_unscaled_in_float32_inside_the_kernel():
    # float16 gradients of about 1e-5, scaled by 2**16, reach the kernel scaled; it unscales in float32.
    # (Fused AdamW, not fused SGD: torch's fused SGD on CPU leaves float16 parameters unchanged.)
    torch.manual_seed(0)
    w16 = torch.nn.Parameter(torch.randn(64).half())
    start = w16.detach().clone()
    ref32 = torch.nn.Parameter(start.float())  # float32 control on the exact gradients
    grad = (torch.randn(64) * 1e-5 * 2.0**16).half().float() / 2.0**16  # exact in float16 once scaled
    opt = LossScaleOptimizer(torch.optim.AdamW([w16], lr=0.1, fused=True), initial_scale=2.0**16)
    ref = torch.optim.AdamW([ref32], lr=0.1, fused=True)
    w16.grad = (grad * 2.0**16).half()
    ref32.grad = grad.clone()
    assert count_syncs(opt.step) == 1  # a first step is decided on the host; the kernel still unscales
    ref.step()
    assert (w16.detach() - start).abs().min() > 0.02  # every weight moved (Adam's first step is about lr)
    torch.testing.assert_close(w16.detach(), ref32.detach().half(), rtol=1e-3, atol=1e-3)


def test_unfused_float16_gradients_are_refused_with_the_fix():
    w = torch.nn.Parameter(torch.randn(4).half())
    opt = LossScaleOptimizer(torch.optim.SGD([w], lr=1.0), initial_scale=8.0)
    w.grad = torch.ones(4).half()
    with pytest.raises(ValueError, match="float16 gradients.*autocast.*fused=True"):
        opt.step()


def _graph_break_reasons(fn) -> set[str]:
    """The first line of each distinct reason dynamo gave for breaking the graph of ``fn``."""
    from torch._dynamo.utils import counters

    dynamo.reset()
    counters.clear()
    torch.compile(fn, backend="eager")()
    return {reason.splitlines()[0] for reason in counters["graph_break"]}


TORCH_OPTIM_BREAKS = {
    "Call to `torch._dynamo.graph_break()`",  # torch.optim's _use_grad, before and after every step
    "Skip calling `torch.compiler.disable()`d function",  # torch's fused kernels are not traced
}


def _scaled_model_and_optimizer(make_model, **inner_kwargs):
    model = make_model(SIZES)
    opt = LossScaleOptimizer(torch.optim.AdamW(model.parameters(), **inner_kwargs))
    (x, y), = batches(1)
    opt.get_scaled_loss(loss_of(model, x, y)).backward()
    return model, opt


def _steady_state(make_model, **inner_kwargs):
    """A model and optimizer after one step (the first is decided on the host), with new gradients."""
    model, opt = _scaled_model_and_optimizer(make_model, **inner_kwargs)
    opt.step()
    (x, y), = batches(1)
    opt.get_scaled_loss(loss_of(model, x, y)).backward()
    return model, opt


# The reasons below are dynamo's words in torch 2.13 and later; torch 2.5 words them differently, and its dynamo
# also breaks at the setattr of grad_scale/found_inf on the optimizer.
_REASONS_OF_TORCH_2_13 = pytest.mark.skipif(
    tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 13),
    reason="asserts the graph-break reasons of torch 2.13's dynamo; older releases word them differently",
)


@_REASONS_OF_TORCH_2_13
def test_torch_compile_fused_step_breaks_only_where_torch_optim_does(make_model):
    # torch.optim breaks the graph around every step on purpose (pytorch#104053),
    # and does not trace its fused kernels; lossscale's fused path adds no reason.
    _, opt = _steady_state(make_model, fused=True)
    assert _graph_break_reasons(lambda: opt.step()) == TORCH_OPTIM_BREAKS


def test_lossscale_work_of_a_step_traces_as_one_graph(make_model):
    from lossscale._torch._kernels import GradGroups, unscale_and_check_

    _, opt = _scaled_model_and_optimizer(make_model, fused=True)
    scale = opt.shared_loss_scale

    def lossscale_part() -> torch.Tensor:
        found_inf = unscale_and_check_(GradGroups.of(opt.param_groups), scale.inv_scale(), out_device=scale.device)
        scale.advance(found_inf)
        return found_inf

    dynamo.reset()
    found_inf = torch.compile(lossscale_part, fullgraph=True, backend="eager")()  # raises on any graph break
    assert float(found_inf) == 0.0
    assert int(opt.dynamic_counter) == 1


def test_grouping_used_under_torch_compile_equals_torchs():
    # Under torch.compile the gradients are grouped in Python (torch 2.5's dynamo cannot trace torch's C++
    # grouping): the same groups, in each the same tensors in the same order, and the same indices.
    from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype

    from lossscale._torch._compat import group_in_python

    grads = [torch.ones(2), torch.ones(3, dtype=torch.float16), torch.zeros(4), torch.ones(1, dtype=torch.bfloat16),
             torch.full((5,), 3.0, dtype=torch.float16)]
    states = [g * 2 for g in grads]
    for with_indices in (False, True):
        ours = group_in_python([grads, states], with_indices)
        torchs = _group_tensors_by_device_and_dtype([grads, states], with_indices=with_indices)
        assert set(ours) == set(torchs) == {(torch.device("cpu"), d) for d in (torch.float32, torch.float16,
                                                                                 torch.bfloat16)}
        for key, (lists, indices) in torchs.items():
            assert [[t.data_ptr() for t in ts] for ts in ours[key][0]] == [[t.data_ptr() for t in ts] for ts in lists]
            assert list(ours[key][1]) == list(indices)
    assert group_in_python([grads, states], True)[(torch.device("cpu"), torch.float16)][1] == [1, 4]


@_REASONS_OF_TORCH_2_13
def test_torch_compile_unfused_step_breaks_once_more_at_the_documented_sync(make_model):
    _, opt = _steady_state(make_model, foreach=True)
    reasons = _graph_break_reasons(lambda: opt.step())
    assert reasons == {"Call to `torch._dynamo.graph_break()`", "Unsupported Tensor.item() call with capture_scalar_outputs=False"}


@pytest.mark.parametrize("check, inject_via", [("step", "grad"), ("step", "input")])
def test_compiled_fused_step_follows_the_eager_trajectory(make_model, check, inject_via):
    data = batches(6)
    eager_model, eager_opt = run_scaled(
        make_model, "adamw-fused", data, inject={2}, inject_via=inject_via, initial_scale=2.0**8,
        dynamic_growth_steps=2,
    )
    model = make_model(SIZES)
    opt = LossScaleOptimizer(
        OPTIMIZERS["adamw-fused"](model.parameters()), initial_scale=2.0**8, dynamic_growth_steps=2
    )
    dynamo.reset()
    compiled_step = torch.compile(opt.step, backend="eager")
    for i, (x, y) in enumerate(data):
        opt.zero_grad()
        if i == 2 and inject_via == "input":
            x = x.clone()
            x[0, 0] = float("inf")
        opt.get_scaled_loss(loss_of(model, x, y)).backward()
        if i == 2 and inject_via == "grad":
            model[0].weight.grad[0, 0] = float("inf")
        compiled_step()
    assert_same_weights(model, eager_model, exact=True)
    assert float(opt.loss_scale) == float(eager_opt.loss_scale)
    assert int(opt.skipped_steps) == 1


@pytest.mark.slow
def test_bench_torch_quick_run_prints_every_case():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_torch.py"), "--quick", "--sizes", "20000"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith(("| adamw", "| sgd"))]
    assert len(rows) == 3 * 2  # three optimizers, clip off and on
    fused_rows = [r.split("|") for r in rows if r.startswith("| adamw-fused")]
    assert all(cells[-2].strip() == "0" for cells in fused_rows)  # lossscale: no added host sync


def test_unscaled_copies_flag_exactly_the_non_finite_copies():
    from lossscale._torch._kernels import combine_flags, unscaled_copies

    inv = torch.tensor(0.25)
    finite = [torch.tensor([4.0, -8.0]), torch.tensor([2.0, 4.0], dtype=torch.float16), None]
    flags: list[torch.Tensor] = []
    copies = unscaled_copies(finite, inv, flags)
    assert copies[2] is None and len(flags) == 2 and combine_flags(flags, torch.device("cpu")).item() == 0.0
    assert torch.equal(copies[0], torch.tensor([1.0, -2.0])) and copies[1].dtype == torch.float16
    assert torch.equal(finite[0], torch.tensor([4.0, -8.0]))  # the inputs are only read
    for bad in ([torch.tensor([1.0, float("inf")])], [torch.tensor([float("nan")], dtype=torch.float16)],
                [torch.sparse_coo_tensor([[0]], [float("inf")], (3,))]):
        flags = []
        unscaled_copies(bad, inv, flags)
        assert combine_flags(flags, torch.device("cpu")).item() == 1.0
    flags = []
    assert unscaled_copies([None], inv, flags) == [None] and flags == []
