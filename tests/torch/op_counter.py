"""``count_ops(fn)``: the torch operators ``fn()`` dispatches (on a GPU, run eagerly, one kernel launch each)."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class _Ops(TorchDispatchMode):
    def __init__(self, views: bool) -> None:
        super().__init__()
        self.views, self.count = views, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += self.views or not func.is_view
        return func(*args, **(kwargs or {}))


def count_ops(fn, views: bool = True) -> int:  # type: ignore[no-untyped-def]
    """``views=False`` leaves out views, which launch no kernel."""
    with _Ops(views) as mode:
        fn()
    return mode.count
