"""The operator's calls on the Kubernetes API, over `rest.Rest`: the writer's six, the Lease's
four, and the names failures are counted and logged by.

Every call has a deadline (rest.API_TIMEOUT, 30 s: a silently dropped TCP connection fails
instead of hanging for ever while /healthz stays green, the field note's failure), runs on the
event loop, and every write is checked against `may_write` right before it goes out: a fenced
leader sends nothing more, not even what was already on its way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec

from deathwatch._api.resources import API_VERSION, KINDS, LEASES, objects
from deathwatch._api.rest import API_TIMEOUT, Rest
from deathwatch._kube.errors import ApiError


class Fenced(Exception):
    """A write was not sent: this replica could no longer prove it holds the lease."""


class _Meta(msgspec.Struct, rename="camel"):
    resource_version: str = ""
    labels: dict[str, str] = msgspec.field(default_factory=dict)


class _Versioned(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


class _WithStatus(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    status: dict[str, Any] | None = None


_versioned = msgspec.json.Decoder(_Versioned).decode
_with_status = msgspec.json.Decoder(_WithStatus).decode


class ApiWrites:
    """The writer's calls (object_writes.WriteApi) on the real API, each with its deadline, each
    write checked against `may_write` right before it is sent and signed with
    `field_manager` (the replica: managedFields and the audit log name it)."""

    def __init__(
        self, rest: Rest, may_write: Callable[[], bool] = lambda: True, field_manager: str = ""
    ) -> None:
        self.rest = rest
        self.may_write = may_write
        self.manager = {"fieldManager": field_manager or "deathwatch"}

    def _guard(self) -> None:
        if not self.may_write():
            raise Fenced("not sent: the lease can no longer be proven")

    async def create(self, plural: str, namespace: str, body: dict[str, Any]) -> str:
        self._guard()
        data = await self.rest.request(
            "POST", objects(plural, namespace), params=self.manager, body=body
        )
        return _versioned(data).metadata.resource_version

    async def replace_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any], version: str
    ) -> str:
        """PUT the whole status: nothing of an earlier one survives by accident (a merge
        patch merges nested objects), and the API server refuses an update of a custom
        resource without a resourceVersion: never a blind write."""
        body = {
            "apiVersion": API_VERSION,
            "kind": KINDS[plural],
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": version},
            "status": status,
        }
        self._guard()
        data = await self.rest.request(
            "PUT", f"{objects(plural, namespace)}/{name}/status", params=self.manager, body=body
        )
        return _versioned(data).metadata.resource_version

    async def apply_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any], manager: str
    ) -> str:
        """Server-side apply of the fields this `manager` owns (a shard's part of a
        DeathWatch status: ADR 0025): the other shards' parts are theirs, so no write fights
        another and none needs the object's resourceVersion. Forced: the fields were another
        manager's before a reshard (the one writer's PUT)."""
        body = {
            "apiVersion": API_VERSION,
            "kind": KINDS[plural],
            "metadata": {"name": name, "namespace": namespace},
            "status": status,
        }
        self._guard()
        data = await self.rest.request(
            "PATCH", f"{objects(plural, namespace)}/{name}/status",
            params={"fieldManager": manager, "force": "true"}, body=body,
            content_type="application/apply-patch+yaml",
        )  # fmt: skip
        return _versioned(data).metadata.resource_version

    async def patch_labels(
        self, plural: str, namespace: str, name: str, labels: dict[str, str], version: str
    ) -> str:
        """A merge patch of these labels alone (others, a person's too, are left as they
        are), with the resourceVersion as its precondition: 409 if the object moved."""
        body = {"metadata": {"resourceVersion": version, "labels": labels}}
        self._guard()
        data = await self.rest.request(
            "PATCH", f"{objects(plural, namespace)}/{name}", params=self.manager, body=body,
            content_type="application/merge-patch+json",
        )  # fmt: skip
        return _versioned(data).metadata.resource_version

    async def delete(self, plural: str, namespace: str, name: str, version: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"resourceVersion": version},
        }
        self._guard()
        await self.rest.request("DELETE", f"{objects(plural, namespace)}/{name}", body=body)

    async def read_status(
        self, plural: str, namespace: str, name: str
    ) -> tuple[dict[str, Any], str, dict[str, str]] | None:
        try:
            data = await self.rest.request("GET", f"{objects(plural, namespace)}/{name}/status")
        except ApiError as exc:
            if exc.not_found:
                return None
            raise
        read = _with_status(data)
        return read.status or {}, read.metadata.resource_version, read.metadata.labels

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self._guard()
        await self.rest.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)


class ApiLease:
    """The elector's calls on its Lease (leader.LeaseApi), each bounded by `timeout` seconds
    (a renewal must not outlive the renew deadline)."""

    def __init__(self, rest: Rest, name: str, namespace: str, timeout: float,
                 field_manager: str) -> None:  # fmt: skip
        self.rest = rest
        self.name, self.namespace = name, namespace
        self.timeout = timeout
        self.collection = f"{LEASES}/namespaces/{namespace}/leases"
        self.manager = {"fieldManager": field_manager}

    async def get(self) -> dict[str, Any] | None:
        return await self.rest.find(f"{self.collection}/{self.name}", deadline=self.timeout)

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        data = await self.rest.request(
            "POST", self.collection, params=self.manager, body=body, deadline=self.timeout
        )
        lease: dict[str, Any] = msgspec.json.decode(data)
        return lease

    async def replace(self, body: dict[str, Any]) -> dict[str, Any]:
        data = await self.rest.request(
            "PUT", f"{self.collection}/{self.name}", params=self.manager, body=body,
            deadline=self.timeout,
        )  # fmt: skip
        lease: dict[str, Any] = msgspec.json.decode(data)
        return lease

    async def watch(
        self, seen: Callable[[str, dict[str, Any] | None], None], seconds: int = 60
    ) -> None:
        """One watch of the Lease by name (RBAC: list and watch on that name), ended by the
        server after `seconds`; `seen(type, lease)` for each event."""
        params: dict[str, str | int] = {
            "watch": "1",
            "fieldSelector": f"metadata.name={self.name}",
            "timeoutSeconds": seconds,
        }
        async with self.rest.stream(self.collection, params, inactivity=seconds + 15) as lines:
            async for line in lines:
                event = msgspec.json.decode(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise ApiError(int(status.get("code") or 500), "watch error",
                                   json.dumps(status).encode())  # fmt: skip
                seen(event["type"], event.get("object"))


__all__ = ["API_TIMEOUT", "ApiLease", "ApiWrites", "Fenced", "Rest"]
