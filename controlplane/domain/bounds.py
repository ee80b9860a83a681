"""Ranges of the numeric settings of a policy, written once: the policy dataclasses check them
(:meth:`Bound.check`) and the REST bodies state them in the OpenAPI document
(:meth:`Bound.limits`, pydantic ``Field`` keywords)."""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_INT = 2**53 - 1  # the largest integer a JSON number carries exactly
MAX_INT32 = 2**31 - 1  # 32-bit ids and counts (token ids, policy step counts, max_moves)


@dataclass(frozen=True)
class Bound:
    """A closed (``ge``, ``le``) or open (``gt``, ``lt``) end on each side, or none; ``integer``:
    an int is required (a bool is never a number here), else any finite int or float."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    integer: bool = False

    def limits(self) -> dict[str, float]:
        """The ends given, as pydantic ``Field`` keywords (``ge``, ``gt``, ``le``, ``lt``)."""
        return {k: v for k, v in (("ge", self.ge), ("gt", self.gt), ("le", self.le), ("lt", self.lt))
                if v is not None}

    def text(self) -> str:
        """The range in interval notation, e.g. ``[1, 1000000]`` or ``(0, 1]``."""
        lo = f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}" if self.gt is not None else "(-inf"
        hi = f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})" if self.lt is not None else "inf)"
        return f"{lo}, {hi}"

    def contains(self, v) -> bool:
        number = int if self.integer else int | float
        if isinstance(v, bool) or not isinstance(v, number) or not math.isfinite(v):
            return False
        return ((self.ge is None or v >= self.ge) and (self.gt is None or v > self.gt)
                and (self.le is None or v <= self.le) and (self.lt is None or v < self.lt))

    def check(self, name: str, v) -> None:
        """Raise ValueError naming ``name``, the range and ``v`` unless ``v`` is in it."""
        if not self.contains(v):
            kind = "an integer" if self.integer else "a finite number"
            raise ValueError(f"{name}: must be {kind} in {self.text()}, got {v!r}")


def _num(v: float) -> str:
    """``2147483647``, ``1e+15`` or ``0.5``: whole numbers in full up to 12 digits."""
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e12 else f"{v:g}"


def check_all(obj, bounds: dict[str, Bound], nullable: frozenset[str] = frozenset()) -> None:
    """Check each attribute of ``obj`` named in ``bounds`` (None allowed where ``nullable``)."""
    for name, bound in bounds.items():
        v = getattr(obj, name)
        if not (v is None and name in nullable):
            bound.check(name, v)
