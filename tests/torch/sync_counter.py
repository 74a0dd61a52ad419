"""Counts host syncs: calls of ``aten._local_scalar_dense`` (``.item()``, ``bool(t)``, ...)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class SyncCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def count_syncs(fn) -> int:  # type: ignore[no-untyped-def]
    with SyncCounter() as counter:
        fn()
    return counter.count
