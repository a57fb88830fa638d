"""Controller replicas electing a leader, for the HA tests and the failover benchmark.

Each replica is a `deathwatch controller` process under the controller's ServiceAccount and
its shipped RBAC, with leader election on (the Lease deathwatch-system/deathwatch-controller),
behind a chaos proxy of its own, so one replica's connection can be cut alone. The control
plane keeps an audit log of every write (ControlPlane(audit=True)); `AuditLog` reads it and
tells each write's replica by its user agent (`deathwatch/<identity> (...)`).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from hack.localcluster.chaosproxy import ChaosProxy
from hack.localcluster.controller_process import (
    ControllerProcess,
    metrics_reader_token,
    service_account_kubeconfig,
)
from hack.localcluster.controlplane import ControlPlane

LEASE = ("deathwatch-system", "deathwatch-controller")


@dataclass
class Replica:
    identity: str
    proxy: ChaosProxy
    process: ControllerProcess

    def readyz(self) -> dict[str, Any]:
        report: dict[str, Any] = self.process.get("/readyz") or {}
        return report

    def leading(self) -> bool:
        return bool(self.readyz().get("details", {}).get("leader", {}).get("may_write"))

    def alive(self) -> bool:
        return self.process.proc is not None and self.process.proc.poll() is None


@dataclass
class Replicas:
    cp: ControlPlane
    api: client.ApiClient
    namespace: str
    tmp: Path
    timings: tuple[float, float, float] = (15.0, 10.0, 2.0)  # controller-runtime's defaults
    members: dict[str, Replica] = field(default_factory=dict)
    reader: str | None = None  # a token that may read the replicas' /readyz and /metrics

    def start(self, identity: str, extra: tuple[str, ...] = ()) -> Replica:
        if self.reader is None:
            self.reader = metrics_reader_token(self.api)
        proxy = ChaosProxy(self.cp.apiserver_port).start()
        kubeconfig = service_account_kubeconfig(
            self.cp, self.api, "deathwatch-system", "deathwatch-controller",
            self.tmp / f"{identity}.kubeconfig", server=f"https://127.0.0.1:{proxy.port}",
        )  # fmt: skip
        lease, renew, retry = self.timings
        process = ControllerProcess(
            kubeconfig, [self.namespace], self.tmp / f"{identity}.log",
            extra=["--leader-elect", f"--identity={identity}", f"--lease-duration={lease}",
                   f"--renew-deadline={renew}", f"--retry-period={retry}", *extra],
            reader_token=self.reader,
        ).start()  # fmt: skip
        replica = self.members[identity] = Replica(identity, proxy, process)
        return replica

    def leader(self) -> Replica | None:
        leading = [r for r in self.members.values() if r.alive() and r.leading()]
        return leading[0] if len(leading) == 1 else None

    def wait_leader(self, timeout: float = 40, other_than: str | None = None) -> Replica:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None and leader.identity != other_than:
                return leader
            time.sleep(0.05)
        raise TimeoutError(f"no leader within {timeout}s: {self.lease_holder()!r}")

    def lease_holder(self) -> str | None:
        leases = client.CoordinationV1Api(self.api)
        try:
            lease = leases.read_namespaced_lease(LEASE[1], LEASE[0], _request_timeout=10)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return lease.spec.holder_identity  # type: ignore[no-any-return]

    def stop(self, identity: str, sig: int = signal.SIGTERM) -> None:
        self.members[identity].process.stop(sig)

    def stop_all(self) -> None:
        for replica in self.members.values():
            if replica.alive():
                replica.process.stop()
            replica.proxy.stop()
        leases = client.CoordinationV1Api(self.api)
        try:  # a clean slate for the next test: no lease left held by a killed replica
            leases.delete_namespaced_lease(LEASE[1], LEASE[0], _request_timeout=10)
        except client.ApiException as exc:
            if exc.status != 404:
                raise


@dataclass(frozen=True)
class Write:
    """One write (or a read the policy keeps) the API server received, from its audit log."""

    identity: str | None  # the replica, from its user agent
    verb: str
    resource: str
    subresource: str | None
    name: str
    received: datetime
    code: int

    @property
    def key(self) -> tuple[str, str | None, str]:
        """The object written (in the namespace): resource, subresource, name."""
        return (self.resource, self.subresource, self.name)

    @property
    def to_lease(self) -> bool:
        return self.resource == "leases"


def _identity(user_agent: str) -> str | None:
    if not user_agent.startswith("deathwatch/"):
        return None
    return user_agent.split("/", 1)[1].split(" ", 1)[0]


class AuditLog:
    def __init__(self, path: Path, namespace: str) -> None:
        self.path = path
        self.namespace = namespace

    def writes(self) -> Iterator[Write]:
        return (w for w in self._requests() if w.verb != "get")

    def reads(self, resource: str = "pods") -> list[Write]:
        """Single objects read (the policy keeps a pod's get), as writes are told."""
        return [w for w in self._requests() if w.verb == "get" and w.resource == resource]

    def _requests(self) -> Iterator[Write]:
        if not self.path.exists():
            return
        text = self.path.read_text(errors="replace")
        # only whole lines: the API server may be writing the last one as we read
        for line in text[: text.rfind("\n") + 1].splitlines():
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            identity = _identity(event.get("userAgent", ""))
            if identity is None or event.get("stage") != "ResponseComplete":
                continue
            if ref.get("resource") != "leases" and ref.get("namespace") != self.namespace:
                continue
            yield Write(
                identity=identity,
                verb=event["verb"],
                resource=ref.get("resource", ""),
                subresource=ref.get("subresource"),
                name=ref.get("name", ""),
                received=datetime.fromisoformat(event["requestReceivedTimestamp"]),
                code=int((event.get("responseStatus") or {}).get("code", 0)),
            )

    def verdict_writes(self, identity: str | None = None) -> list[Write]:
        """Writes of SandboxVerdicts, DeathWatch status and Events (not the Lease)."""
        return [
            w for w in self.writes()
            if not w.to_lease and (identity is None or w.identity == identity)
        ]  # fmt: skip
