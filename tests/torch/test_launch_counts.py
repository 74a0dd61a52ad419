"""What loss scaling adds to a torch step off the CPU, counted on ``meta`` tensors (benchmarks/kernel_count.py): one
operator is one kernel launch on a GPU, and a host read is a sync. Counts are deterministic, so they are pinned."""

from __future__ import annotations

import pytest

from benchmarks.kernel_count import count_meta

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
