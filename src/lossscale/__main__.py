"""``python -m lossscale``: see :mod:`lossscale._cli`."""

from ._cli import main

raise SystemExit(main())
