"""JAX code shared by :mod:`lossscale.jax` and Keras on the JAX backend: the finite check that takes no conditional
and the choice by platform. Imports jax; the package root never imports it."""
