"""Assertions on the JSON results of ``_scenarios.py``: one skipped step and one clean step, on every replica."""

from __future__ import annotations

from _scenarios import INITIAL_SCALE


def phase(result: dict, name: str) -> list[dict]:
    """The per-replica records of one phase; fails with the scenario's own error if it raised."""
    if "error" in result:
        raise AssertionError(f"scenario failed before its steps: {result['error']}")
    value = result.get(name)
    if value is None:
        raise AssertionError(f"phase {name!r} did not run; result keys: {sorted(result)}")
    if isinstance(value, dict) and "error" in value:
        raise AssertionError(f"phase {name!r} raised: {value['error']}\n  at {value.get('where')}")
    return value


def replicas(results: list[dict], name: str) -> list[dict]:
    """All replicas' records of ``name``, over the results of every worker (in worker order)."""
    return [record for result in results for record in phase(result, name)]


def state_of(record: dict) -> tuple:
    return (record["scale"], record["step_counter"], record["skipped_steps"], record["iterations"])


def assert_same_on_every_replica(records: list[dict], what: str) -> None:
    states = [state_of(r) for r in records]
    assert len(set(states)) == 1, (
        f"{what}: scale state differs between replicas (scale, counter, skipped, it): {states}"
    )
    weights = [tuple(r["weights"]) for r in records]
    assert len(set(weights)) == 1, f"{what}: weights differ between replicas"


def check_skip_then_step(results: list[dict], cls: str, replica_count: int) -> None:
    """The issue's contract: a step with an Inf on one replica is skipped everywhere (weights, inner slots and
    iterations bit-identical, one backoff, skipped_steps == 1, the same scale state on every replica); the
    next clean step applies everywhere."""
    before = replicas(results, "before")
    bad = replicas(results, "after_bad")
    assert len(bad) == replica_count, f"expected {replica_count} replicas, got {len(bad)}"
    for i, (b, a) in enumerate(zip(before, bad)):
        where = f"replica {i} after the step with an Inf on replica 0"
        assert a["weights"] == b["weights"], f"{where}: weights changed (finite now: {a['weights_finite']})"
        changed = sorted(k for k in b["slots"] if a["slots"].get(k) != b["slots"][k])
        assert not changed, f"{where}: inner optimizer variables changed: {changed}"
        assert a["iterations"] == b["iterations"], f"{where}: iterations {b['iterations']} -> {a['iterations']}"
        assert a["inner_iterations"] == b["inner_iterations"], f"{where}: inner iterations advanced"
        assert a["scale"] == INITIAL_SCALE / 2, (
            f"{where}: scale {b['scale']} -> {a['scale']}, expected one backoff to {INITIAL_SCALE / 2}"
        )
        assert a["step_counter"] == 0, f"{where}: growth counter {a['step_counter']}, expected 0"
        if cls == "lossscale":
            assert a["skipped_steps"] == 1, f"{where}: skipped_steps {a['skipped_steps']}, expected 1"
    assert_same_on_every_replica(bad, "after the skipped step")

    good = replicas(results, "after_good")
    for i, (b, a) in enumerate(zip(bad, good)):
        where = f"replica {i} after the clean step"
        assert a["weights_finite"], f"{where}: weights are not finite"
        assert all(x != y for x, y in zip(a["weights"], b["weights"])), f"{where}: some weight did not move"
        assert a["iterations"] == b["iterations"] + 1, f"{where}: iterations {b['iterations']} -> {a['iterations']}"
        assert a["scale"] == INITIAL_SCALE / 2 and a["step_counter"] == 1, (
            f"{where}: scale {a['scale']}, counter {a['step_counter']}; expected {INITIAL_SCALE / 2}, 1"
        )
        if cls == "lossscale":
            assert a["skipped_steps"] == 1, f"{where}: skipped_steps {a['skipped_steps']}, expected 1"
        moved = [k for k in b["slots"] if "momentum" in k or "velocity" in k]
        assert all(a["slots"][k] != b["slots"][k] for k in moved), f"{where}: some Adam slot did not move"
    assert_same_on_every_replica(good, "after the clean step")
