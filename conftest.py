"""Root conftest: doctests of the bindings are not collected when their framework is missing.

``pytest`` collects the doctests of ``src/`` (``--doctest-modules``). A
binding's modules import their framework at the top, so with numpy and pytest
alone (``pip install -e . pytest``) only the core's doctests are collected.
``tests/conftest.py`` does the same for the tests.
"""

from __future__ import annotations

import importlib.util

#: What each part of the package needs, beyond numpy.
_NEEDS = {
    "src/lossscale/torch/*": ["torch"],
    "src/lossscale/_jax/*": ["jax"],
    "src/lossscale/_torch/*": ["torch"],
    "src/lossscale/torch/integrations/accelerate.py": ["torch", "accelerate"],
    "src/lossscale/torch/integrations/_compat.py": ["torch", "accelerate"],
    "src/lossscale/torch/integrations/lightning.py": ["torch", "lightning"],
    "src/lossscale/jax/*": ["jax", "optax"],
    "src/lossscale/jax/train_state.py": ["jax", "optax", "flax"],
    "src/lossscale/keras/*": ["keras"],
    "src/lossscale/demo/*": ["torch", "jax", "optax", "sklearn", "matplotlib", "rich"],
}


def installed(module: str) -> bool:
    """Whether ``module`` is really installed: a directory such as tests/jax on sys.path is not JAX."""
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.origin is not None


collect_ignore_glob = [glob for glob, modules in _NEEDS.items() if not all(installed(m) for m in modules)]
