"""What two deathwatch releases in one cluster must not share, checked at runtime (ADR 0038).

The chart refuses a second release that would share a node's table or a host port with
another release's firewall, or serve the DeathWatches another release's controller serves,
with `lookup` at install. Under `helm template | kubectl apply` (Argo CD, Flux) nothing runs
`lookup`. So the controller and the firewall agent run the same check on what is in the
cluster: the workloads of every release (Deployments and DaemonSets labelled
`app.kubernetes.io/part-of: deathwatch`) and the notes the chart puts on them:
`deathwatch.dev/controller-id` and `deathwatch.dev/scope` on a controller's Deployment,
`deathwatch.dev/table` and `deathwatch.dev/host-ports` on a firewall's DaemonSet.

Of two that collide, the older keeps what it holds and the younger yields (the first
applied is the one in force, as with `lookup`): its controller never leads, its agents never
touch the table. Both say so, naming the other. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

PART_OF: Final = "app.kubernetes.io/part-of"
INSTANCE: Final = "app.kubernetes.io/instance"
COMPONENT: Final = "app.kubernetes.io/component"
CONTROLLER_ID: Final = "deathwatch.dev/controller-id"
SCOPE: Final = "deathwatch.dev/scope"
TABLE: Final = "deathwatch.dev/table"
HOST_PORTS: Final = "deathwatch.dev/host-ports"
SELECTOR: Final = f"{PART_OF}=deathwatch"  # the list both parts ask for
DEFAULT_TABLE, DEFAULT_PORTS = "deathwatch", "9101,9102"
CONTROLLER_ID_CLASH, TABLE_CLASH, HOST_PORT_CLASH = "controller-id", "table", "host-port"


@dataclass(frozen=True, slots=True)
class Workload:
    """A release's controller Deployment or firewall DaemonSet, as far as collisions go."""

    kind: str  # Deployment or DaemonSet
    namespace: str
    name: str
    release: str  # its app.kubernetes.io/instance
    component: str  # controller or firewall
    created: str  # creationTimestamp (RFC 3339: ordered as text)
    notes: Mapping[str, str]

    @property
    def who(self) -> str:
        return f"release {self.release} (namespace {self.namespace}, {self.kind} {self.name})"

    @property
    def other(self) -> str:
        """The other release as a metric label: NAMESPACE/RELEASE."""
        return f"{self.namespace}/{self.release}"

    def same_release(self, other: Workload) -> bool:
        return (self.namespace, self.release) == (other.namespace, other.release)


def workload(obj: Mapping[str, Any], kind: str) -> Workload | None:
    """A Deployment or DaemonSet (as JSON, or its metadata alone) if it is a deathwatch
    release's controller or firewall; else None."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    component = labels.get(COMPONENT)
    if labels.get(PART_OF) != "deathwatch" or component not in ("controller", "firewall"):
        return None
    if meta.get("deletionTimestamp"):
        return None  # on its way out (an uninstall, a prune): it holds nothing any more
    notes = {k: str(v) for k, v in (meta.get("annotations") or {}).items()
             if k.startswith("deathwatch.dev/")}  # fmt: skip
    return Workload(kind, str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                    str(labels.get(INSTANCE) or ""), str(component),
                    str(meta.get("creationTimestamp") or ""), notes)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Collision:
    """`mine` and `theirs` would share `what`; `yields`: mine is the younger, and gives way."""

    what: str
    mine: Workload
    theirs: Workload
    detail: str
    # when each release first applied a workload of this component: a sharded release is
    # as old as its oldest shard, so every shard of it agrees with the other release
    mine_born: str
    theirs_born: str

    @property
    def yields(self) -> bool:
        """The first applied wins; a tie (same second) by namespace and release, so both
        sides agree on one winner."""
        theirs = (self.theirs_born, self.theirs.namespace, self.theirs.release)
        return theirs < (self.mine_born, self.mine.namespace, self.mine.release)

    @property
    def message(self) -> str:
        if self.yields:
            outcome = (
                "this release's controller never leads while it does"
                if self.what == CONTROLLER_ID_CLASH
                else "this release's firewall agents leave the table alone while it does"
                if self.what == TABLE_CLASH
                else "this release's firewall agents cannot be scheduled while it does"
            )
            return f"{self.detail} {self.theirs.who}, applied first: {outcome}; {_fix[self.what]}"
        return (f"{self.detail} {self.theirs.who}, applied later, which gives way: this release "
                f"keeps it; {_fix[self.what]} in that release")  # fmt: skip


_fix = {
    CONTROLLER_ID_CLASH: "give one release its own controller.controllerId (and annotate its "
    "DeathWatches deathwatch.dev/controller-id), or serve other namespaces (scope.namespaces)",
    TABLE_CLASH: "give one release its own firewall.table",
    HOST_PORT_CLASH: "give one release other firewall.metricsPort and firewall.exits.metricsPort",
}


def _scope(w: Workload) -> set[str] | None:
    """The namespaces a controller serves; None: every one."""
    text = w.notes.get(SCOPE, "*")
    return None if text in ("", "*") else set(text.split(","))


def collisions(mine: Workload, listed: Iterable[Workload]) -> list[Collision]:
    """What `mine` shares with another release's workload of its own component, as the
    chart's `lookup` refuses it: a controller id over namespaces both serve; a table; a host
    port. `listed`: every release's workloads (mine and its own shards among them). Ordered
    by what, then by the other release."""
    others = list(listed)
    born: dict[tuple[str, str], str] = {}
    for w in (mine, *others):
        if w.component == mine.component:
            key = (w.namespace, w.release)
            born[key] = min(born.get(key, w.created), w.created)
    found: list[Collision] = []

    def clash(what: str, theirs: Workload, detail: str) -> None:
        found.append(Collision(what, mine, theirs, detail, born[(mine.namespace, mine.release)],
                               born[(theirs.namespace, theirs.release)]))  # fmt: skip

    for theirs in others:
        if theirs.same_release(mine) or theirs.component != mine.component:
            continue
        if mine.component == "controller":
            if theirs.notes.get(CONTROLLER_ID, "") != mine.notes.get(CONTROLLER_ID, ""):
                continue
            a, b = _scope(mine), _scope(theirs)
            if a is None or b is None or a & b:
                chosen = mine.notes.get(CONTROLLER_ID, "")
                served = (f"the DeathWatches of controller id {chosen!r}" if chosen else
                          "the DeathWatches without a controller id")  # fmt: skip
                clash(CONTROLLER_ID_CLASH, theirs, f"{served}, in namespaces both serve, are "
                      "served by the controller of")  # fmt: skip
            continue
        table = mine.notes.get(TABLE, DEFAULT_TABLE)
        if theirs.notes.get(TABLE, DEFAULT_TABLE) == table:
            clash(TABLE_CLASH, theirs, f"table inet {table} on every node is the firewall's of")
        ours = set(mine.notes.get(HOST_PORTS, DEFAULT_PORTS).split(",")) - {""}
        shared = ours & set(theirs.notes.get(HOST_PORTS, DEFAULT_PORTS).split(","))
        if shared:
            ports = ",".join(sorted(shared, key=lambda p: (len(p), p)))
            clash(HOST_PORT_CLASH, theirs, f"host port {ports} on every node is taken by the "
                  "firewall of")  # fmt: skip
    # one per other release and what (a sharded release has a Deployment per shard)
    unique = {(c.what, c.theirs.other): c for c in sorted(found, key=lambda c: c.theirs.name,
                                                           reverse=True)}  # fmt: skip
    return sorted(unique.values(), key=lambda c: (c.what, c.theirs.other))


def mine_in(objects: Iterable[Workload], namespace: str, name: str) -> Workload | None:
    return next((w for w in objects if (w.namespace, w.name) == (namespace, name)), None)
