"""Building knowledge search programs in tests: one step of a program's ``steps``."""

from __future__ import annotations

from typing import Any


def step(op: str, name: str | None = None, **args: Any) -> dict[str, Any]:
    """The step ``{"op": op, "args": args}``, bound to ``name`` (its ``"as"``) when given."""
    out: dict[str, Any] = {"op": op, "args": args}
    if name is not None:
        out["as"] = name
    return out
