"""Torch code shared by :mod:`lossscale.torch` and Keras on the torch backend: passes over the gradients, the fused
scale update, and every private torch API. Imports torch; the package root never imports it."""
