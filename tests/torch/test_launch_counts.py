"""What loss scaling adds to a torch step off the CPU, counted on ``meta`` tensors (benchmarks/kernel_count.py): one
operator is one kernel launch on a GPU, and a host read is a sync. Counts are deterministic, so they are pinned."""

from __future__ import annotations

import pytest
import torch

from benchmarks.kernel_count import OpCounter, count_meta, critical_paths

#: torch.amp.GradScaler's own cost over a fused AdamW step (scale, the check, the update): the bar.
GRADSCALER_FUSED = 10


def added(variant, kind="adamw-fused", tensors=100, steps=2):
    rows = count_meta(variant, kind, 1e6, tensors, steps)
    assert len(set(rows)) == 1, rows  # every step alike
    return rows[0]


def test_gradscaler_cost_is_the_bar():
    assert added("GradScaler") == (GRADSCALER_FUSED, 0)


@pytest.mark.parametrize("variant", ["dynamic", "lossscale GradScaler"])
@pytest.mark.parametrize("tensors", [100, 1000])
def test_default_and_drop_in_add_no_more_than_gradscaler_and_never_read(variant, tensors):
    ops, reads = added(variant, tensors=tensors)
    assert ops <= GRADSCALER_FUSED and reads == 0


@pytest.mark.parametrize("kind", ["adamw-foreach", "sgd"])
@pytest.mark.parametrize("variant", ["dynamic", "lossscale GradScaler"])
def test_unfused_optimizers_add_no_more_than_gradscaler(kind, variant):
    theirs = added("GradScaler", kind)
    ops, reads = added(variant, kind)
    assert ops <= theirs[0] and reads <= theirs[1] == 1  # the skip is decided on the host, as torch's


@pytest.mark.parametrize("tensors", [100, 1000])
def test_statistics_cost_nothing_unsampled_and_do_not_grow_with_tensors_sampled(tensors):
    rows = count_meta("stats N=16", "adamw-fused", 1e6, tensors, 17)
    unsampled, sampled = rows[0][0], rows[13][0]
    assert unsampled <= GRADSCALER_FUSED and sampled <= 40
    assert {r for i, r in enumerate(rows) if i != 13} == {(unsampled, 0)} and rows[13][1] == 0


@pytest.mark.parametrize("tensors", [100, 1000])
def test_an_unsampled_auto_step_adds_at_most_gradscalers_cost_plus_two(tensors):
    """Between two samples an ``AutoLossScale`` step looks its overflow up in a table (6 operators for the rule,
    where the dynamic rule's kernel form takes 5). A sampled step runs the rule eagerly and rebuilds the table: not
    at its bar of 40, pinned so that it can only fall."""
    rows = count_meta("auto", "adamw-fused", 1e6, tensors, 17)
    unsampled, sampled = rows[0][0], rows[13][0]
    assert unsampled <= GRADSCALER_FUSED + 2 and all(r[1] == 0 for r in rows)
    assert {r[0] for i, r in enumerate(rows) if i != 13} == {unsampled}  # every unsampled step alike
    assert sampled <= 232


def test_the_critical_path_follows_results_and_in_place_writes():
    """``OpCounter.depth``: the longest chain of operators each reading what the one before wrote."""
    x = torch.ones(3, device="meta")
    with OpCounter() as counter:
        a = x + 1  # 1
        b = a * 2  # 2
        x.add_(b)  # 3, in place
        y = x.neg()  # 4: reads the write
        _ = a - 1  # 2: beside the chain
        torch._foreach_mul_([y, a], 2.0)  # 5, both written
        _ = a.sqrt()  # 6
    assert (counter.depth, counter.total) == (6, 7)


def test_a_sampled_auto_step_is_a_chain_of_dependent_operators_longer_than_its_bar():
    """Why a sampled ``"auto"`` step is not at 40 operators: its operators depend on each other in a chain of 54
    (the measurement, then the rule on its result), so no eager batching of them launches fewer than 54 kernels.
    A statistics-only sampled step's chain is 7. Pinned so that it can only fall."""
    auto, stats = critical_paths("auto"), critical_paths("stats N=16")
    assert (auto[1], stats[1], stats[13]) == (5, 4, 7)
    assert 40 < auto[13] <= 54
