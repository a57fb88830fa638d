"""The Deployment a replica's Lease belongs to: its ownerReference, so that what deletes the
Deployment (`helm uninstall`, `kubectl delete -f`, Argo CD's prune, a reshard that drops a
shard) deletes the Lease with it through the garbage collector. The Lease does not outlive its
release, held in the name of a process that is gone (issue #59: the next install's leaders
waited 20-34 s on such a Lease; its release on shutdown was refused, the release's Role
deleted first).

The elector never creates its Lease for an owner that is gone: the Lease vanishing under a
replica whose Deployment was deleted is the garbage collector's doing, and re-creating it would
hand a stopping replica the slots its successors are taking (`present`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from deathwatch._api.rest import Rest
from deathwatch._kube.errors import describe, label
from deathwatch._operator.instruments.metrics import Metrics

log = structlog.get_logger("deathwatch.leader")

TIMEOUT = 30.0  # seconds: every API call's cap


class LeaseOwner:
    def __init__(self, rest: Rest, namespace: str, name: str, metrics: Metrics) -> None:
        self.rest, self.namespace, self.name, self.metrics = rest, namespace, name, metrics
        self.path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"
        self.uid: str | None = None
        self.error: str | None = None  # why it is not known, for /readyz

    @property
    def reference(self) -> dict[str, Any] | None:
        """The Lease's ownerReference (None until the owner is known). No blockOwnerDeletion:
        that needs the Deployment's finalizers, and nothing waits on the Lease."""
        if self.uid is None:
            return None
        return {"apiVersion": "apps/v1", "kind": "Deployment", "name": self.name,
                "uid": self.uid}  # fmt: skip

    async def _read(self) -> dict[str, Any] | None:
        return await self.rest.find(self.path, deadline=TIMEOUT)

    async def learn(self) -> None:
        """At start: the owner's uid. A failure is said (log, metric, /readyz) and leaves the
        Lease without an owner, as before: it then outlives an uninstall; nothing else waits."""
        try:
            deployment = await asyncio.wait_for(self._read(), TIMEOUT)
        except Exception as exc:
            self.error = describe(exc)[:200]
            self.metrics.api_errors.labels("lease_owner", label(exc)).inc()
            log.error("the Lease's owner could not be read: the Lease will outlive an uninstall",
                      owner=f"deployment/{self.name}", error=self.error)  # fmt: skip
            return
        if deployment is None:
            self.error = f"deployment {self.namespace}/{self.name} not found"
            log.error("the Lease's owner does not exist: the Lease will outlive an uninstall",
                      owner=f"deployment/{self.name}")  # fmt: skip
            return
        self.uid, self.error = deployment["metadata"]["uid"], None
        log.info("the Lease belongs to its Deployment", owner=f"deployment/{self.name}",
                 uid=self.uid)  # fmt: skip

    async def present(self) -> bool:
        """Whether the owner still stands, as this replica knew it: the same uid, and not being
        deleted (a foreground deletion, Argo CD's prune by default, keeps the Deployment until
        its pods are gone, while the garbage collector deletes the Lease). Asked before the
        Lease is created; an unknown owner, or an unanswered read, does not stop a creation."""
        if self.uid is None:
            return True
        try:
            deployment = await asyncio.wait_for(self._read(), TIMEOUT)
        except Exception as exc:
            self.metrics.api_errors.labels("lease_owner", label(exc)).inc()
            return True
        if deployment is None:
            return False
        meta = deployment["metadata"]
        return meta.get("uid") == self.uid and not meta.get("deletionTimestamp")

    def status(self) -> dict[str, Any]:
        return {"owner": f"deployment/{self.name}", "uid": self.uid, "error": self.error}
