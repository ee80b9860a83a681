"""The lifecycle of a decision: placement plans and memory-offload decisions share it.

    proposed ──approve──► approved ──push──► pushed ──report──► applied ──rollback──► rolled_back
        │                     │                 └──────report/timeout──► failed
        └──reject / superseded┘
    advisory: created final (nothing to push: shown, never applied)

``ALLOWED_FROM`` is the one table of legal transitions; every status change in the store goes
through :func:`check_transition`. Pure: no I/O.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    PROPOSED = "proposed"
    APPROVED = "approved"
    PUSHED = "pushed"
    APPLIED = "applied"
    FAILED = "failed"
    REJECTED = "rejected"
    SUPERSEDED = "superseded"
    ROLLED_BACK = "rolled_back"
    ADVISORY = "advisory"


OPEN = (Status.PROPOSED, Status.APPROVED)  # waiting for an operator or the controller
IN_FLIGHT = (Status.PUSHED,)  # sent to the job, not yet reported
RAN = (Status.APPLIED, Status.ROLLED_BACK)  # placements the job ran at some step
INITIAL = (Status.PROPOSED, Status.APPROVED, Status.ADVISORY)  # what a new decision may be

ALLOWED_FROM: dict[Status, tuple[Status, ...]] = {
    Status.APPROVED: (Status.PROPOSED,),
    Status.PUSHED: (Status.APPROVED,),
    Status.REJECTED: OPEN,
    Status.SUPERSEDED: OPEN,
    Status.APPLIED: IN_FLIGHT,
    Status.FAILED: IN_FLIGHT,
    Status.ROLLED_BACK: (Status.APPLIED,),
}


class Conflict(Exception):
    """A lifecycle step that the decision's state does not allow (REST: 409)."""


def check_transition(current: str, to: Status, what: str) -> None:
    """Raise Conflict unless ``current`` → ``to`` is legal. ``what`` names the decision."""
    allowed = ALLOWED_FROM.get(to, ())
    if current not in allowed:
        needs = ", ".join(allowed) if allowed else "nothing (a decision is created in it)"
        raise Conflict(f"{what} is {current}; {to} needs one of {needs}")


def is_final(status: str) -> bool:
    """No transition leaves ``status``."""
    return not any(status in sources for sources in ALLOWED_FROM.values())
