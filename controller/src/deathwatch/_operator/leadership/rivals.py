"""Other releases that share what this one holds, read on a period (ADR 0038).

The chart refuses a colliding second release with `lookup`, which nothing runs under `helm
template | kubectl apply`. So the controller reads, every `interval`, every release's
Deployments and DaemonSets (label `app.kubernetes.io/part-of: deathwatch`, cluster-wide, read
only) and checks its own Deployment and firewall DaemonSet against them
(deathwatch._kube.releases).
- A controller id over namespaces both serve: the younger release's controller never leads
  (`refusal`, asked by the elector before every acquisition or renewal, leader.py) and is
  says so in /readyz; the older keeps leading. Never two writers of one verdict.
- A table or host port of the firewall: the younger's agents leave the table alone (the
  agent checks it too) or cannot be scheduled; its controller says so.
- The CRDs, where this release applies them too (`crds_release`): their
  `deathwatch.dev/release` naming another release means both apply them, each sync taking
  them from the other. Nothing can give way there at runtime; it is said.
Each collision is said, naming the other release: a log line and an Event on this replica's
Deployment when it begins, the gauge `deathwatch_release_collisions`, the DeathWatches'
`ReleaseConflict` condition, and /readyz while this controller yields.

Without leader election (one replica, no Lease) there is no elector to ask: `keep_off` asks
instead, every RETRY seconds, and stands the replica down (it writes nothing; what it judges
is owed, as a standby's is) while it must give way, and leads it again once nothing stands in
its way.

A read that fails is counted and logged once per spell, and the last answer stands. Until the
first answer this controller does not lead: under `kubectl apply` its RBAC and a colliding
release's Deployment may arrive with it, and a leader for even one check interval would be a
second writer. The read is retried every RETRY seconds until it answers; every chart that
passes --lease-owner grants it.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import structlog

from deathwatch._api.resources import DW_PLURAL, GROUP, SV_PLURAL
from deathwatch._api.rest import Rest
from deathwatch._engine.timeutil import UTC, format_time
from deathwatch._kube.errors import describe, label
from deathwatch._kube.releases import (
    CONTROLLER_ID_CLASH,
    SELECTOR,
    Collision,
    Workload,
    collisions,
    mine_in,
    workload,
)
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.leadership.group import Leadership

log = structlog.get_logger("deathwatch.rivals")
TIMEOUT = 30.0  # seconds: every API call's cap
RETRY = 2.0  # seconds between reads until the first answer
EVENT_REASON = "ReleaseCollision"
CRDS = tuple(f"{plural}.{GROUP}" for plural in (DW_PLURAL, SV_PLURAL))
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
RELEASE_NOTE = "deathwatch.dev/release"  # on each CRD: NAMESPACE/RELEASE that applied it
CRD_CLASH = "crd"


class Rivals:
    def __init__(self, rest: Rest, metrics: Metrics, namespace: str, deployment: str,
                 firewall: str | None, crds_release: str | None = None) -> None:  # fmt: skip
        """`deployment`: this replica's own (namespace/name it runs in); `firewall`: the
        release's firewall DaemonSet as NAMESPACE/NAME (None: none); `crds_release`: this
        release's NAMESPACE/RELEASE when it applies the CRDs (None: it does not)."""
        self.rest, self.metrics = rest, metrics
        self.namespace, self.deployment, self.firewall = namespace, deployment, firewall
        self.crds_release = crds_release
        self.collisions: tuple[Collision, ...] = ()
        self.crds: tuple[tuple[str, str], ...] = ()  # (CRD, the other release applying it)
        self.read = False  # answered at least once
        self.error: str | None = None  # the last read's failure, for /readyz

    def refusal(self) -> str | None:
        """Why this controller must not lead: another release's older controller serves the
        same DeathWatches, or the releases have not been read yet. None: nothing stands in
        its way."""
        if not self.read:
            why = self.error or "no answer yet"
            return (
                f"the other deathwatch releases have not been read yet ({why}): a controller "
                "does not lead before it knows no older release serves its DeathWatches; "
                f"tried every {RETRY:g}s"
            )
        for c in self.collisions:
            if c.what == CONTROLLER_ID_CLASH and c.yields:
                return c.message
        return None

    def messages(self) -> list[str]:
        """Every collision, as the DeathWatches' ReleaseConflict condition says it."""
        return [c.message for c in self.collisions] + [_crd_message(*c) for c in self.crds]

    async def run(self, interval: float) -> None:
        """Read every `interval`, forever (supervised)."""
        failing = False
        while True:
            try:
                await asyncio.wait_for(self.check(), TIMEOUT * 2)
            except Exception as exc:
                self.error = describe(exc)[:300]
                self.metrics.api_errors.labels("list_releases", label(exc)).inc()
                if not failing:
                    log.warning("cannot read the other releases: collisions with them are not "
                                "checked until it can", error=self.error)  # fmt: skip
                failing = True
            else:
                if failing:
                    log.info("the other releases readable again")
                failing, self.error = False, None
            await asyncio.sleep(interval if self.read else min(interval, RETRY))

    async def check(self) -> None:
        """One reading: every release's workloads; this one's collisions with them."""
        listed: list[Workload] = []
        for kind, plural in (("Deployment", "deployments"), ("DaemonSet", "daemonsets")):
            found = await self.rest.get(f"/apis/apps/v1/{plural}", labelSelector=SELECTOR)
            for obj in found.get("items") or []:
                if (w := workload(obj, kind)) is not None:
                    listed.append(w)
        now: list[Collision] = []
        mine = mine_in(listed, self.namespace, self.deployment)
        if mine is not None:
            now += collisions(mine, listed)
        if self.firewall:
            ns, name = self.firewall.split("/", 1)
            if (fw := mine_in(listed, ns, name)) is not None:
                now += collisions(fw, listed)
        crds: list[tuple[str, str]] = []
        if self.crds_release:
            for name in CRDS:
                crd = await self.rest.find(f"{CRD_PATH}/{name}", deadline=TIMEOUT) or {}
                holder = ((crd.get("metadata") or {}).get("annotations") or {}).get(RELEASE_NOTE)
                if holder and holder != self.crds_release:
                    crds.append((name, str(holder)))
        self.read = True
        await self._said(tuple(now), tuple(crds), mine)

    async def _said(self, now: tuple[Collision, ...], crds: tuple[tuple[str, str], ...],
                    mine: Workload | None) -> None:  # fmt: skip
        def key(c: Collision) -> tuple[str, str, str]:
            return (c.what, c.theirs.other, str(c.yields).lower())

        said = {key(c): c.message for c in now}
        said |= {(CRD_CLASH, other, "false"): _crd_message(name, other) for name, other in crds}
        before = {key(c) for c in self.collisions} | {(CRD_CLASH, o, "false") for _, o in self.crds}
        self.collisions, self.crds = now, crds
        for gone in before - said.keys():
            self.metrics.release_collisions.remove(*gone)
            log.info("no longer shares anything with that release", what=gone[0], other=gone[1])
        for labels, message in said.items():
            self.metrics.release_collisions.labels(*labels).set(1)
            if labels in before:
                continue
            log.error("another release shares what this one holds", what=labels[0],
                      other=labels[1], yields=labels[2], message=message)  # fmt: skip
            if mine is not None:
                await self._event(mine, message)

    async def _event(self, mine: Workload, message: str) -> None:
        """A Warning Event on this replica's Deployment: `kubectl describe` shows it. A
        failure to post it is counted and logged; the collision is said anyway."""
        now = format_time(datetime.now(UTC))
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{mine.name}.", "namespace": mine.namespace},
            "involvedObject": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": mine.name,
                "namespace": mine.namespace,
            },
            "reason": EVENT_REASON,
            "message": message[:1024],
            "type": "Warning",
            "source": {"component": "deathwatch-controller"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.rest.request("POST", f"/api/v1/namespaces/{mine.namespace}/events",
                                    body=body, deadline=TIMEOUT)  # fmt: skip
        except Exception as exc:
            self.metrics.api_errors.labels("event", label(exc)).inc()
            log.warning("the collision's Event not posted", error=describe(exc)[:200])


def _crd_message(name: str, other: str) -> str:
    return (f"CRD {name} is applied by release {other} too: one release per cluster applies "
            "the CRDs, and each sync takes them from the other; set crds.enabled=false on one "
            "of them (it is served by the other's)")  # fmt: skip


def heed(rivals: Rivals, leadership: Leadership) -> None:
    """Without leader election, what the elector asks before every try: the only writer
    stands down while `rivals` says it must give way, and leads again once nothing stands in
    its way. Never two writers of one verdict, with or without a Lease."""
    why = rivals.refusal()
    if why is not None and leadership.leading:
        log.error("not leading", why=why)
        leadership.standby(f"refused: {why}")
    elif why is None and not leadership.leading:
        log.info("no longer refused: the only replica leads again")
        leadership.lead(None, "nothing shared with another release: the only writer")


async def keep_off(rivals: Rivals, leadership: Leadership, every: float = RETRY) -> None:
    """`heed`, every `every` seconds (supervised, forever)."""
    while True:
        heed(rivals, leadership)
        await asyncio.sleep(every)
