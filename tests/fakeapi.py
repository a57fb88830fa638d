"""An in-memory stand-in for the calls the writer makes (writer.WriteApi), for unit tests of
the writer's and the controller's logic. It keeps objects and Events with resourceVersions,
replaces statuses whole (PUT), answers 404/409/422 like the API (a stale resourceVersion in a
write or a delete precondition is a 409; an update without one, 422), and lets a test hold
calls in flight or make the next ones fail. As on the API server, a write that changes
nothing leaves the resourceVersion where it was."""

from __future__ import annotations

import asyncio
import copy
from collections import Counter, defaultdict
from typing import Any

from kubernetes.client import ApiException

Key = tuple[str, str, str]


class FakeApi:
    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, Key]] = []
        self.writes: list[tuple[Key, dict[str, Any]]] = []  # every status sent, as sent
        self.fail: dict[str, list[int]] = defaultdict(list)  # operation -> statuses to raise
        self.hold: asyncio.Event | None = None  # while set to an unset Event, calls wait
        self._inflight: Counter[Key] = Counter()
        self.most_inflight: Counter[Key] = Counter()
        self._rv = 0

    def _bump(self, key: Key) -> str:
        self._rv += 1
        self.objects[key].setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        return str(self._rv)

    def version(self, plural: str, namespace: str, name: str) -> str:
        key = (plural, namespace, name)
        if "resourceVersion" not in self.objects[key].setdefault("metadata", {}):
            return self._bump(key)  # put in place by a test: it has a version like any object
        return str(self.objects[key]["metadata"]["resourceVersion"])

    def put(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> str:
        """Another writer (a replica that lost the lease, a person): the object changes."""
        key = (plural, namespace, name)
        self.objects.setdefault(key, {"metadata": {"name": name, "namespace": namespace}})
        self.objects[key]["status"] = copy.deepcopy(status)
        return self._bump(key)

    async def _call(self, operation: str, key: Key) -> None:
        self.calls.append((operation, key))
        self._inflight[key] += 1
        self.most_inflight[key] = max(self.most_inflight[key], self._inflight[key])
        try:
            if self.hold is not None:
                await self.hold.wait()
            if self.fail[operation]:
                raise ApiException(status=self.fail[operation].pop(0), reason="injected")
        finally:
            self._inflight[key] -= 1

    async def create(self, plural: str, namespace: str, body: dict[str, Any]) -> str:
        key = (plural, namespace, body["metadata"]["name"])
        await self._call("create", key)
        if key in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        self.objects[key] = copy.deepcopy(body)
        return self._bump(key)

    async def replace_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any], version: str
    ) -> str:
        """PUT on the status subresource: the whole status, at `version` or a 409."""
        key = (plural, namespace, name)
        await self._call("replace_status", key)
        if key not in self.objects:
            raise ApiException(status=404, reason="NotFound")
        if not version:
            raise ApiException(
                status=422, reason="Invalid: metadata.resourceVersion: must be specified"
            )
        if version != self.version(*key):
            raise ApiException(status=409, reason="Conflict")
        self.writes.append((key, copy.deepcopy(status)))
        if self.objects[key].get("status") == status:
            return version  # as the API server: a write that changes nothing
        self.objects[key]["status"] = copy.deepcopy(status)
        return self._bump(key)

    async def patch_labels(
        self, plural: str, namespace: str, name: str, labels: dict[str, str], version: str
    ) -> str:
        """A merge patch of metadata.labels, at `version` or a 409."""
        key = (plural, namespace, name)
        await self._call("patch_labels", key)
        if key not in self.objects:
            raise ApiException(status=404, reason="NotFound")
        if version != self.version(*key):
            raise ApiException(status=409, reason="Conflict")
        meta = self.objects[key].setdefault("metadata", {})
        if all(meta.get("labels", {}).get(k) == v for k, v in labels.items()):
            return version
        meta.setdefault("labels", {}).update(labels)
        return self._bump(key)

    def labels(self, plural: str, namespace: str, name: str) -> dict[str, str]:
        labels: dict[str, str] = (
            self.objects[(plural, namespace, name)].get("metadata", {}).get("labels") or {}
        )
        return labels

    async def delete(self, plural: str, namespace: str, name: str, version: str) -> None:
        key = (plural, namespace, name)
        await self._call("delete", key)
        if key not in self.objects:
            raise ApiException(status=404, reason="NotFound")
        if version != self.version(*key):
            raise ApiException(status=409, reason="Conflict")
        del self.objects[key]

    async def read_status(
        self, plural: str, namespace: str, name: str
    ) -> tuple[dict[str, Any], str, dict[str, str]] | None:
        key = (plural, namespace, name)
        await self._call("read_status", key)
        if key not in self.objects:
            return None
        status = copy.deepcopy(self.objects[key].get("status") or {})
        return status, self.version(*key), dict(self.labels(*key))

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        key = ("events", namespace, body["metadata"]["name"])
        await self._call("create_event", key)
        if key[1:] in self.events:
            raise ApiException(status=409, reason="AlreadyExists")
        self.events[(namespace, body["metadata"]["name"])] = copy.deepcopy(body)

    def status(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """What the status says, without the writer's term stamp (see `term`)."""
        obj = self.objects.get((plural, namespace, name))
        if obj is None:
            return None
        status = obj.get("status")
        return None if status is None else {k: v for k, v in status.items() if k != "term"}

    def term(self, plural: str, namespace: str, name: str) -> int | None:
        """The term stamped on the object's status by the writer that wrote it last."""
        term: int | None = (self.objects[(plural, namespace, name)].get("status") or {}).get("term")
        return term

    def operations(self, key: Key) -> list[str]:
        return [op for op, k in self.calls if k == key]


class Link:
    """One replica's way to the fake API, which can be cut like a network: while `held`,
    its calls wait in flight (bytes held by TCP), and arrive when it heals, whenever that is."""

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        self._open = asyncio.Event()
        self._open.set()
        self.waiting = 0

    def partition(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.api, name)

        async def through(*args: Any, **kwargs: Any) -> Any:
            self.waiting += 1
            try:
                await self._open.wait()
            finally:
                self.waiting -= 1
            return await call(*args, **kwargs)

        return through


class FakeTimers:
    """The writer's retry timer, driven by the test: records each delay, fires on demand."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self._due: list[Any] = []

    def __call__(self, delay: float, callback: Any) -> None:
        self.delays.append(delay)
        self._due.append(callback)

    def fire(self) -> int:
        due, self._due = self._due, []
        for callback in due:
            callback()
        return len(due)

    @property
    def waiting(self) -> int:
        return len(self._due)
