"""Another release's firewall on the same table: the younger leaves it alone (ADR 0038).

The chart refuses, with `lookup`, a release whose firewall would share a node's table with
another's; `helm template | kubectl apply` runs no `lookup`. Two agents writing one table
would replace each other's rules at every resync, each release's sandboxes guarded only
between the other's writes. So each agent reads every release's firewall DaemonSet (label
`app.kubernetes.io/part-of: deathwatch`, read only) and checks its own against them
(deathwatch._kube.releases): of two on one table, the one applied later yields. It never
applies, repairs or removes the table (not even with --remove-on-uninstall), is not ready,
and its coverage Lease says who holds the table, so its verdicts say `Shielded=False
TableContested` naming that release. Until the DaemonSets are listed it cannot know: a table
in force stays untouched until then (as until the Nodes are listed); with none on the node it
applies its own at once, since there is nothing to contest and a node without a table is open.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from deathwatch._kube.releases import (
    SELECTOR,
    TABLE_CLASH,
    Collision,
    Workload,
    collisions,
    mine_in,
    workload,
)
from deathwatch.firewall.kubeapi import Api
from deathwatch.firewall.mirror import Mirror

PATH = "/apis/apps/v1/daemonsets"


def _kept(obj: Mapping[str, Any]) -> Workload | None:
    return workload(obj, "DaemonSet")


class FirewallReleases(Mirror[Workload | None]):
    """Every release's firewall DaemonSet, as last seen."""

    def __init__(self, api: Api, wake: Callable[[], None], failed: Callable[[], None],
                 stop: threading.Event) -> None:  # fmt: skip
        super().__init__(api, PATH, "daemonset", _kept, wake, failed, stop, SELECTOR)


def table_holder(listed: list[Workload | None] | None, namespace: str, daemonset: str
                 ) -> Collision | None:  # fmt: skip
    if listed is None:
        return None
    known = [w for w in listed if w is not None]
    mine = mine_in(known, namespace, daemonset)
    if mine is None:
        return None
    for c in collisions(mine, known):
        if c.what == TABLE_CLASH and c.yields:
            return c
    return None
