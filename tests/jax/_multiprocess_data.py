"""The model and data of the two-process test, shared by the workers and the single-process reference."""

import jax.numpy as jnp
import numpy as np

INITIAL_SCALE = 2.0**10


def init_params():
    w = np.random.default_rng(1).normal(size=(2, 4)).astype(np.float32)  # row i lives on process i
    return w, np.array([0.5, -0.5], np.float32)  # b[i] too


def batch(inf_on):
    """A (2, 8, 4) batch: block i is process i's data; an Inf in block ``inf_on`` (None: clean)."""
    x = np.random.default_rng(2).normal(size=(2, 8, 4)).astype(np.float32)
    if inf_on is not None:
        x[inf_on, 3, 2] = np.inf
    return x


def loss_fn(params, x):
    # Row i of w and b[i] meet block i of the batch only: the gradients on process 0 are finite even when
    # process 1's data holds an Inf, so only a global check makes process 0 skip.
    pred = jnp.einsum("pnk,pk->pn", x, params["w"]) + params["b"][:, None]
    return jnp.mean((pred - 1.0) ** 2)
