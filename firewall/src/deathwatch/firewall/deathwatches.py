"""What the cluster's DeathWatches select, as the firewall agent reads them: the pods its
inbound rule guards on this node are the pods they select (ADR 0037), so a sandbox has one
definition, the DeathWatch's, and agent-sandbox's pods are guarded with no label of ours.

Every DeathWatch counts, whichever controller serves it: a pod another release judges is a
sandbox too, and guarding it costs that pod nothing a sandbox does not already accept (only
pods reach its agent ports). A DeathWatch whose selection cannot be read guards nothing,
as its controller judges nothing by it (its status says why); the agent logs it once per
edit. Read-only: deathwatches list/watch, cluster-wide.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog

from deathwatch._kube.selection import Selection, read_selection
from deathwatch._kube.selector import SelectorError
from deathwatch.firewall.kubeapi import Api
from deathwatch.firewall.mirror import Mirror

log = structlog.get_logger("deathwatch.firewall")
PATH = "/apis/deathwatch.dev/v1alpha1/deathwatches"
Read = Selection | str  # its selection, or why it cannot be read


def read(deathwatch: Mapping[str, Any]) -> Read:
    meta = deathwatch.get("metadata") or {}
    try:
        return read_selection(deathwatch)
    except SelectorError as exc:
        log.warning("a DeathWatch's selection cannot be read; it guards nothing",
                    namespace=meta.get("namespace"), deathwatch=meta.get("name"),
                    error=str(exc)[:300])  # fmt: skip
        return str(exc)


def selections(read: Iterable[Read]) -> tuple[Selection, ...]:
    return tuple(r for r in read if isinstance(r, Selection))


class DeathWatches(Mirror[Read]):
    def __init__(self, api: Api, wake: Callable[[], None], failed: Callable[[], None],
                 stop: threading.Event) -> None:  # fmt: skip
        super().__init__(api, PATH, "deathwatch", read, wake, failed, stop)
