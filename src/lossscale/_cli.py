"""Command line: ``python -m lossscale demo``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lossscale", description="lossscale command line")
    sub = parser.add_subparsers(dest="command", required=True)
    # add_help=False: "demo --help" reaches the demo's own parser, which documents its options.
    sub.add_parser("demo", add_help=False, help="train fp32 vs fp16 vs fp16 + lossscale and plot the difference")
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from ._demo import main as demo_main

        return demo_main(rest)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
