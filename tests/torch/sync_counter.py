"""``count_syncs(fn)``: host syncs made by ``fn()`` (see ``lossscale.torch.HostSyncCounter``)."""

from __future__ import annotations

from lossscale.torch import HostSyncCounter


def count_syncs(fn) -> int:  # type: ignore[no-untyped-def]
    with HostSyncCounter() as counter:
        fn()
    return counter.count
