"""How many passes over the model's state a compiled XLA program makes, read from its HLO text.

``passes(jax.jit(step).lower(*args).compile().as_text(), n_params)`` walks
the entry computation's kernels (fusions, copies, dots, reductions, ...),
those of the computations it ``call``s, and, for a ``conditional`` or a
``while``, the kernels of each branch or of the loop's body, and adds up the
bytes each kernel reads (its operands) and writes (its result), counting only
arrays of at least ``min_elements`` elements (default: 2 % of the parameters,
so the weight matrices and their gradients and moments, not biases, scalars or
the activations of a small batch). Dividing by the parameters' bytes gives
*passes*: plain Adam reads the gradient, both moments and the weights and
writes the moments and the weights, 7 passes, on top of the backward pass's
own reads and writes.

The count is static: it says what the program will move, not how fast the
machine moves it, so it is the same on a busy machine and a quiet one for the
same XLA version and backend (another backend compiles another program). It
counts an operand as read whole, which slightly overstates a kernel that reads
a slice. A conditional's branches and a loop's body are reported apart (only one
branch runs; a body runs an unknown number of times).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Passes", "passes"]

_BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "f16": 2, "bf16": 2, "s16": 2, "u16": 2,
          "s8": 1, "u8": 1, "pred": 1}
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([\d,]*)\]")
_HEADER = re.compile(r"^(ENTRY )?%([\w.\-]+) \(.*\{\s*$")
_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (.+?) ([\w\-]+)\((.*?)\)(.*)$")
_NO_KERNEL = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "after-all", "partition-id"}
_BYTES.update({"c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1})
_ARRAY = re.compile(r"\b(" + "|".join(sorted(_BYTES, key=len, reverse=True)) + r")\[([\d,]*)\]")


@dataclass
class Passes:
    """Reads and writes of state-sized arrays, in passes (bytes / parameter bytes)."""

    reads: float = 0.0
    writes: float = 0.0
    kernels: int = 0
    copies: int = 0
    branches: list[Passes] = field(default_factory=list)

    @property
    def total(self) -> float:
        """Reads plus writes at the top level (branches apart)."""
        return self.reads + self.writes

    @property
    def taken(self) -> float:
        """The top level plus its largest branch: the most a step can move."""
        return self.total + max((b.taken for b in self.branches), default=0.0)


def _size(text: str, min_elements: int) -> int:
    total = 0
    for dtype, dims in _ARRAY.findall(text):
        count = 1
        for d in filter(None, dims.split(",")):
            count *= int(d)
        if count >= min_elements:
            total += count * _BYTES[dtype]
    return total


def _computations(hlo: str) -> tuple[str, dict[str, list[str]]]:
    entry, name, bodies = "", None, {}
    for line in hlo.splitlines():
        header = _HEADER.match(line)
        if header:
            name = header.group(2)
            bodies[name] = []
            entry = name if header.group(1) else entry
        elif line.startswith("}"):
            name = None
        elif name is not None:
            bodies[name].append(line)
    return entry, bodies


def passes(hlo: str, n_params: int, param_bytes: int = 4, min_elements: int | None = None) -> Passes:
    """The passes of the program ``hlo`` (``compiled.as_text()``) over ``n_params`` parameters."""
    if min_elements is None:
        min_elements = max(1, n_params // 50)
    entry, bodies = _computations(hlo)
    shapes = {}
    for lines in bodies.values():
        for line in lines:
            m = _INSTRUCTION.match(line)
            if m:
                shapes[m.group(1)] = m.group(2)
    unit = n_params * param_bytes

    def walk(name: str) -> Passes:
        out = Passes()
        for line in bodies[name]:
            m = _INSTRUCTION.match(line)
            if not m:
                continue
            _, shape, op, args, rest = m.groups()
            if op == "conditional":
                listed = re.search(r"branch_computations=\{([^}]*)\}", rest)
                names = [b.strip().lstrip("%") for b in listed.group(1).split(",")] if listed else [
                    b for key in ("true_computation", "false_computation")
                    for b in re.findall(key + r"=%?([\w.\-]+)", rest)
                ]
                out.branches += [walk(b) for b in names]
                continue
            if op == "call":
                called = walk(re.search(r"to_apply=%?([\w.\-]+)", rest).group(1))
                out.reads, out.writes = out.reads + called.reads, out.writes + called.writes
                out.kernels, out.copies = out.kernels + called.kernels, out.copies + called.copies
                out.branches += called.branches
                continue
            if op == "while":
                out.branches += [walk(b) for b in re.findall(r"(?:body|condition)=%?([\w.\-]+)", rest)]
                continue
            if op in _NO_KERNEL:
                continue
            read = sum(_size(shapes.get(a, ""), min_elements) for a in re.findall(r"%([\w.\-]+)", args))
            written = _size(shape, min_elements)
            if read + written:
                out.reads += read / unit
                out.writes += written / unit
                out.kernels += 1
                out.copies += op == "copy"
        return out

    return walk(entry)
