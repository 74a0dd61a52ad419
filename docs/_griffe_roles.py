"""A griffe extension for `make docs`: Sphinx cross-reference roles in docstrings render as code.

The docstrings are Google style but name other objects with Sphinx roles (:class:`X`, :func:`~a.b`), which
Markdown would show as written. This rewrites each role to inline code (``~`` keeps the last component, as Sphinx
does) once the package is loaded; the source is not touched.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|exc|data|obj):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"


class SphinxRolesAsCode(Extension):
    def on_package(self, *, pkg: Object, **kwargs: Any) -> None:
        seen: set[int] = set()
        stack: list[Object] = [pkg]
        while stack:
            obj = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = ROLE.sub(_code, obj.docstring.value)
            stack.extend(m for m in obj.members.values() if not m.is_alias)
