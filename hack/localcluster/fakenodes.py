"""Nodes with no kubelet, for the control plane's own controllers to act on.

The disruption lane (tests/apiserver/test_disruptions.py) runs kube-scheduler and kube-controller-manager
with every controller: node lifecycle, taint eviction, pod GC, disruption. They act on Node
objects and the pods bound to them. No kubelet runs here, so this module plays the two parts of
a kubelet those controllers depend on, and nothing else:

- `NodeKeeper`: the Node objects (capacity, the Ready condition) and their heartbeat, the
  Lease in kube-node-lease that a kubelet renews (every `renew` seconds); `silence(node)`
  stops one, as a kubelet that died or lost its network (the node lifecycle controller then
  marks it unreachable, taints it and marks its pods not Ready);
- `Terminator`: what a kubelet does once a pod on its node is being deleted (its
  deletionTimestamp set by the Eviction API, the scheduler, the taint manager, a person):
  the containers stopped (SIGTERM: exit 143), the pod's terminal phase Failed, then the
  deletion confirmed (grace 0). Pods on a silenced node stay as they are: nobody is there.

Every call has a timeout; both run a thread that logs and carries on through API errors.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, watch

TIMEOUT = (5, 30)
LEASES = "kube-node-lease"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_body(name: str, index: int, cpu: str, memory: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "spec": {},
        "status": {"addresses": [{"type": "InternalIP", "address": f"10.99.0.{index + 10}"}]},
    }


def ready_status(cpu: str, memory: str, index: int, since: str) -> dict[str, Any]:
    capacity = {"cpu": cpu, "memory": memory, "pods": "110"}
    now = _now()
    conditions = [
        {"type": t, "status": "False", "reason": f"KubeletHas{r}", "message": m,
         "lastHeartbeatTime": now, "lastTransitionTime": since}
        for t, r, m in (
            ("MemoryPressure", "SufficientMemory", "kubelet has sufficient memory available"),
            ("DiskPressure", "NoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "SufficientPID", "kubelet has sufficient PID available"),
        )
    ]  # fmt: skip
    conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                       "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
                       "lastTransitionTime": since})  # fmt: skip
    return {
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": conditions,
        "addresses": [{"type": "InternalIP", "address": f"10.99.0.{index + 10}"}],
        "nodeInfo": {
            "kubeletVersion": "v1.35.4",
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
            "containerRuntimeVersion": "none://0",
            "kernelVersion": "",
            "osImage": "",
            "bootID": "",
            "machineID": "",
            "systemUUID": "",
        },
    }


class NodeKeeper:
    """Nodes kept Ready the way their kubelets would keep them: Lease renewals, and the
    Ready condition's heartbeat (less often, as a kubelet does)."""

    def __init__(
        self,
        api: client.ApiClient,
        names: Iterable[str],
        *,
        cpu: str = "4",
        memory: str = "8Gi",
        capacity: dict[str, str] | None = None,
        renew: float = 1.0,
        status_every: float = 10.0,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.names = list(names)
        self.cpu = {n: cpu for n in self.names} | dict(capacity or {})
        self.memory = memory
        self.renew = renew
        self.status_every = status_every
        self.silent: set[str] = set()
        self.gone: set[str] = set()
        self.since = _now()
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-keeper", daemon=True)

    def start(self) -> NodeKeeper:
        for i, name in enumerate(self.names):
            self.core.create_node(node_body(name, i, self.cpu[name], self.memory),
                                  _request_timeout=TIMEOUT)  # fmt: skip
            self._status(name)
            node = self.core.read_node(name, _request_timeout=TIMEOUT)
            self.coordination.create_namespaced_lease(LEASES, {
                "metadata": {"name": name, "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Node", "name": name, "uid": node.metadata.uid}]},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                         "renewTime": _micro_now()},
            }, _request_timeout=TIMEOUT)  # fmt: skip
        self._thread.start()
        return self

    def _status(self, name: str) -> None:
        i = self.names.index(name)
        status = ready_status(self.cpu[name], self.memory, i, self.since)
        self.core.patch_node_status(name, {"status": status}, _request_timeout=TIMEOUT)

    def silence(self, name: str) -> None:
        """Its kubelet stops reporting (it died, or its network did)."""
        self.silent.add(name)

    def forget(self, name: str) -> None:
        """Its Node object is about to be deleted: nothing heartbeats it any more."""
        self.gone.add(name)

    def _run(self) -> None:
        last_status = time.monotonic()
        while not self._stop.wait(self.renew):
            status_due = time.monotonic() - last_status >= self.status_every
            for name in self.names:
                if name in self.silent or name in self.gone:
                    continue
                try:
                    self.coordination.patch_namespaced_lease(
                        name, LEASES, {"spec": {"renewTime": _micro_now()}},
                        _request_timeout=TIMEOUT,
                    )  # fmt: skip
                    if status_due:
                        self._status(name)
                except Exception as exc:  # the lane's own plumbing: counted, printed, retried
                    self.errors += 1
                    print(f"node keeper: {name}: {exc!r}"[:300])
            if status_due:
                last_status = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _terminated_status(pod: Any) -> dict[str, Any]:
    """What a kubelet writes once a deleted pod's containers stopped on SIGTERM: exit 143,
    the pod Failed (the terminal phase a kubelet gives a pod before confirming its deletion),
    not Ready. Conditions are patched by type: the DisruptionTarget stays as it was."""
    now = _now()
    containers = []
    for cs in pod.status.container_statuses or []:
        started = cs.state.running.started_at if cs.state and cs.state.running else None
        containers.append({
            "name": cs.name, "ready": False, "restartCount": cs.restart_count, "image": cs.image,
            "imageID": cs.image_id or "", "started": False,
            "state": {"terminated": {
                "exitCode": 143, "reason": "Error",
                "startedAt": started.strftime("%Y-%m-%dT%H:%M:%SZ") if started else now,
                "finishedAt": now}},
        })  # fmt: skip
    return {
        "phase": "Failed",
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "PodCompleted",
                "lastTransitionTime": now,
            },
            {
                "type": "ContainersReady",
                "status": "False",
                "reason": "PodCompleted",
                "lastTransitionTime": now,
            },
        ],
        "containerStatuses": containers,
    }


class Terminator:
    """Confirms the deletion of pods on kept nodes, as their kubelets would."""

    def __init__(self, api: client.ApiClient, namespace: str, keeper: NodeKeeper) -> None:
        self.core = client.CoreV1Api(api)
        self.ns = namespace
        self.keeper = keeper
        self.done: set[str] = set()
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="terminator", daemon=True)

    def start(self) -> Terminator:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                stream = watch.Watch().stream(self.core.list_namespaced_pod, self.ns,
                                              timeout_seconds=10, _request_timeout=30)  # fmt: skip
                for event in stream:
                    if event["type"] != "DELETED":
                        self._maybe_finish(event["object"])
                    if self._stop.is_set():
                        return
            except Exception as exc:
                self.errors += 1
                print(f"terminator: {exc!r}"[:300])
                self._stop.wait(0.5)

    def _maybe_finish(self, pod: Any) -> None:
        meta = pod.metadata
        node = pod.spec.node_name
        if meta.deletion_timestamp is None or meta.uid in self.done or node is None:
            return
        if node in self.keeper.silent or node in self.keeper.gone or node not in self.keeper.names:
            return  # no kubelet there to confirm anything
        self.done.add(meta.uid)
        try:
            self.core.patch_namespaced_pod_status(
                meta.name, self.ns, {"status": _terminated_status(pod)}, _request_timeout=TIMEOUT
            )
            self.core.delete_namespaced_pod(
                meta.name, self.ns, grace_period_seconds=0,
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta.uid}},
                _request_timeout=TIMEOUT,
            )  # fmt: skip
        except client.ApiException as exc:
            if exc.status != 404:  # gone already: nothing to confirm
                self.errors += 1
                print(f"terminator: {meta.name}: {exc.status} {exc.body}"[:400])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)
