"""Play kubelet against a real API server: create sandbox pods and write their status.

No kubelet runs on the local control plane, so the demo and the tests write what a kubelet
would (pods/status), on the schedule of a `SandboxScript` (controller/sandbox_script.py).
Every call has a timeout.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from kubernetes import client

from deathwatch._engine.timeutil import UTC
from hack.localcluster.sandbox_script import (
    GRACE_SECONDS,
    Moment,
    SandboxScript,
    pod_manifest,
    timeline,
)

TIMEOUT = (5, 30)


class Kubelet:
    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)

    def create(self, script: SandboxScript) -> str:
        pod = self.core.create_namespaced_pod(
            script.namespace, pod_manifest(script), _request_timeout=TIMEOUT
        )
        return str(pod.metadata.uid)

    def status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.core.patch_namespaced_pod_status(
            name, namespace, {"status": status}, _request_timeout=TIMEOUT
        )

    def request_deletion(self, namespace: str, name: str, grace: int = GRACE_SECONDS) -> None:
        """What `kubectl delete` does: the API sets deletionTimestamp; the pod stays until its
        kubelet confirms the containers stopped (see `finish_deletion`)."""
        self.core.delete_namespaced_pod(
            name, namespace, grace_period_seconds=grace, _request_timeout=TIMEOUT
        )

    def finish_deletion(self, namespace: str, name: str) -> None:
        """What kubelet does once the containers are gone: delete with grace 0."""
        try:
            self.core.delete_namespaced_pod(
                name, namespace, grace_period_seconds=0, _request_timeout=TIMEOUT
            )
        except client.ApiException as exc:
            if exc.status != 404:
                raise

    def apply(self, script: SandboxScript, moment: Moment) -> None:
        if moment.kind == "status" and moment.status is not None:
            self.status(script.namespace, script.name, moment.status)
        elif moment.kind == "delete-request":
            self.request_deletion(script.namespace, script.name)
        elif moment.kind == "deleted":
            self.finish_deletion(script.namespace, script.name)

    def play(
        self,
        scripts: Iterable[SandboxScript],
        on_moment: Callable[[SandboxScript, Moment], None] | None = None,
        until: timedelta | None = None,
    ) -> None:
        """Create every pod at its script's start and apply each moment at its time, in real
        time. `script.start` values are absolute (use `now + offset`)."""
        queue: list[tuple[datetime, int, SandboxScript, Moment | None]] = []
        for i, s in enumerate(scripts):
            heapq.heappush(queue, (s.start, i * 1000, s, None))
            for j, m in enumerate(timeline(s), start=1):
                heapq.heappush(queue, (s.start + m.at, i * 1000 + j, s, m))
        end = datetime.now(UTC) + until if until is not None else None
        while queue:
            at, _, script, moment = heapq.heappop(queue)
            if end is not None and at > end:
                break
            delay = (at - datetime.now(UTC)).total_seconds()
            if delay > 0:
                time.sleep(delay)
            if moment is None:
                self.create(script)
            else:
                self.apply(script, moment)
            if on_moment is not None and moment is not None:
                on_moment(script, moment)
