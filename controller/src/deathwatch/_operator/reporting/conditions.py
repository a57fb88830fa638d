"""A status condition, its transition time kept while its status holds: for the
SandboxVerdict's and the DeathWatch's conditions alike."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from deathwatch._api.resources import (
    Condition,
    ConditionStatus,
)

if TYPE_CHECKING:
    pass


def condition(
    kind: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    since: datetime | None,
    previous: Iterable[Condition] = (),
) -> Condition:
    """A condition; its lastTransitionTime stays the previous one's while the status holds."""
    for old in previous:
        if old.type == kind and old.status is status:
            since = old.last_transition_time
            break
    return Condition(
        type=kind, status=status, reason=reason, message=message, last_transition_time=since
    )
