"""``conds_inside_conds(jaxpr)``: how many conditionals a jaxpr runs inside other conditionals."""

from __future__ import annotations


def conds_inside_conds(jaxpr, depth=0):  # type: ignore[no-untyped-def]
    found = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "cond":
            found += depth > 0
            found += sum(conds_inside_conds(branch.jaxpr, depth + 1) for branch in eqn.params["branches"])
        else:  # a jit or custom_jvp inside: its jaxpr (closed or not) among the params
            for value in eqn.params.values():
                sub = getattr(value, "jaxpr", value)
                if hasattr(sub, "eqns"):
                    found += conds_inside_conds(sub, depth)
    return found
