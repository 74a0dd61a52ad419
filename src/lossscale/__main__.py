"""``python -m lossscale <command>``: the commands are listed by ``--help``; ``--version`` prints the version."""

from __future__ import annotations

import sys

HELP = """usage: python -m lossscale [-h] [-V] <command> [options]

lossscale: loss scaling for mixed-precision training (PyTorch, JAX/optax, Keras 3).

commands:
  demo       train a digits autoencoder in float32, float16 and float16 + lossscale (torch and JAX) and compare;
             needs lossscale[demo]. `python -m lossscale demo --help` lists its options.

options:
  -h, --help     show this message and exit
  -V, --version  print lossscale's version and exit
"""


def version() -> str:
    """The installed distribution's version (its metadata), else the package's ``__version__`` (a source tree)."""
    from importlib import metadata

    try:
        return metadata.version("lossscale")
    except metadata.PackageNotFoundError:
        from . import __version__

        return __version__


def main(argv: list[str] | None = None) -> int:
    """Dispatches ``demo [options]`` to :func:`lossscale.demo.main`; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(HELP, file=sys.stdout if argv else sys.stderr, end="")
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"lossscale {version()}")
        return 0
    if argv[0] != "demo":
        print(f"python -m lossscale: unknown command {argv[0]!r}; the one command is 'demo' "
              "(python -m lossscale --help lists it).", file=sys.stderr)
        return 2
    from .demo import main as demo_main

    return demo_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
