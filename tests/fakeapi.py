"""The fake API server for unit tests: one in-memory store of objects with resourceVersions,
and the faces each part of deathwatch calls it through. Lanes use the real API server.

- `FakeApi` itself is the writer's face (object_writes.WriteApi): it keeps objects and Events,
  replaces statuses whole (PUT), answers 404/409/422 like the API (a stale resourceVersion in
  a write or a delete precondition is a 409; an update without one, 422), and lets a test
  hold calls in flight or make the next ones fail. As on the API server, a write that
  changes nothing leaves the resourceVersion where it was.
- `FakeApi.lease(namespace, name)`: the elector's face on one Lease (kube.ApiLease), with
  watchers told of each change.
- `FakeApi.agent()`: the firewall agent's face (firewall.kubeapi.Api): pods and Nodes listed
  from the store (a fieldSelector on spec.nodeName and an equality labelSelector honoured),
  each watch of a collection serving the next batch queued in `streams[path]`, coverage
  Leases read and written by path.

`down` makes the lease's and the agent's calls fail as a dead connection would.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from deathwatch._kube.errors import ApiError, NoAnswer
from deathwatch.firewall.kubeapi import query

Key = tuple[str, str, str]  # (plural, namespace, name): "" for a cluster-scoped object
LEASES = "leases"
LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/"
DAEMONSET_PATH = "/apis/apps/v1/namespaces/"


class FakeApi:
    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, Key]] = []
        self.writes: list[tuple[Key, dict[str, Any]]] = []  # every status sent, as sent
        # operation -> what to raise next: a status (the API's refusal) or an exception
        self.fail: dict[str, list[int | Exception]] = defaultdict(list)
        self.hold: asyncio.Event | None = None  # while set to an unset Event, calls wait
        self._inflight: Counter[Key] = Counter()
        self.most_inflight: Counter[Key] = Counter()
        self._rv = 0
        self.down = False  # the lease's and the agent's calls: no answer
        self.watchers: dict[Key, list[Callable[[str, dict[str, Any] | None], None]]] = {}
        self.streams: dict[str, list[list[dict[str, Any]]]] = defaultdict(list)
        self.requests: list[tuple[str, str]] = []  # the agent's: (method or WATCH, path?query)

    # --- the store ----------------------------------------------------------------------------

    def add(self, plural: str, namespace: str, obj: dict[str, Any]) -> str:
        """Put an object in place (as another client would); returns its version."""
        key = (plural, namespace, obj["metadata"]["name"])
        self.objects[key] = copy.deepcopy(obj)
        return self._bump(key)

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((plural, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def lease(self, namespace: str, name: str) -> FakeLease:
        return FakeLease(self, (LEASES, namespace, name))

    def agent(self) -> FakeAgentApi:
        return FakeAgentApi(self)

    def _changed(self, key: Key, event_type: str) -> None:
        for seen in list(self.watchers.get(key, ())):
            seen(event_type, self.get(*key))

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
                failure = self.fail[operation].pop(0)
                if isinstance(failure, Exception):
                    raise failure
                raise ApiError(failure, "injected")
        finally:
            self._inflight[key] -= 1

    async def create(self, plural: str, namespace: str, body: dict[str, Any]) -> str:
        key = (plural, namespace, body["metadata"]["name"])
        await self._call("create", key)
        if key in self.objects:
            raise ApiError(409, "AlreadyExists")
        self.objects[key] = copy.deepcopy(body)
        return self._bump(key)

    async def replace_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any], version: str
    ) -> str:
        """PUT on the status subresource: the whole status, at `version` or a 409."""
        key = (plural, namespace, name)
        await self._call("replace_status", key)
        if key not in self.objects:
            raise ApiError(404, "NotFound")
        if not version:
            raise ApiError(422, "Invalid: metadata.resourceVersion: must be specified")
        if version != self.version(*key):
            raise ApiError(409, "Conflict")
        self.writes.append((key, copy.deepcopy(status)))
        if self.objects[key].get("status") == status:
            return version  # as the API server: a write that changes nothing
        self.objects[key]["status"] = copy.deepcopy(status)
        return self._bump(key)

    async def apply_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any], manager: str
    ) -> str:
        """Server-side apply as the API server does it for a DeathWatch status: the
        `shards` list merged by its key, every other field the applier's."""
        key = (plural, namespace, name)
        await self._call("apply_status", key)
        if key not in self.objects:
            raise ApiError(404, "NotFound")
        self.writes.append((key, copy.deepcopy(status)))
        current = copy.deepcopy(self.objects[key].get("status") or {})
        parts = {p["shard"]: p for p in current.get("shards") or []}
        parts.update({p["shard"]: p for p in status.get("shards") or []})
        current.update({k: v for k, v in status.items() if k != "shards"})
        if parts:
            current["shards"] = [parts[k] for k in sorted(parts)]
        self.objects[key]["status"] = current
        return self._bump(key)

    async def patch_labels(
        self, plural: str, namespace: str, name: str, labels: dict[str, str], version: str
    ) -> str:
        """A merge patch of metadata.labels, at `version` or a 409."""
        key = (plural, namespace, name)
        await self._call("patch_labels", key)
        if key not in self.objects:
            raise ApiError(404, "NotFound")
        if version != self.version(*key):
            raise ApiError(409, "Conflict")
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
            raise ApiError(404, "NotFound")
        if version != self.version(*key):
            raise ApiError(409, "Conflict")
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
            raise ApiError(409, "AlreadyExists")
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


class FakeLease:
    """One Lease of the store, as the elector calls it (kube.ApiLease): a stale replace is a
    409, and watchers see each change."""

    def __init__(self, api: FakeApi, key: Key) -> None:
        self.api, self.key = api, key

    @property
    def lease(self) -> dict[str, Any] | None:
        """The Lease as stored (a test may change it in place, as another writer would)."""
        return self.api.objects.get(self.key)

    @property
    def holder(self) -> str | None:
        holder: str | None = ((self.lease or {}).get("spec") or {}).get("holderIdentity")
        return holder

    @property
    def watchers(self) -> list[Callable[[str, dict[str, Any] | None], None]]:
        return self.api.watchers.setdefault(self.key, [])

    def bump(self) -> None:
        """A new version of the Lease as it is now (after a test changed it in place)."""
        self.api._bump(self.key)

    def _check(self) -> None:
        if self.api.down:
            raise ApiError(503, "ServiceUnavailable")

    async def get(self) -> dict[str, Any] | None:
        self._check()
        return self.api.get(*self.key)

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check()
        if self.key in self.api.objects:
            raise ApiError(409, "AlreadyExists")
        self.api.add(LEASES, self.key[1], body)
        self.api._changed(self.key, "ADDED")
        return copy.deepcopy(self.api.objects[self.key])

    async def replace(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check()
        current = self.api.objects.get(self.key)
        if current is None:
            raise ApiError(404, "NotFound")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict")
        self.api.add(LEASES, self.key[1], body)
        self.api._changed(self.key, "MODIFIED")
        return copy.deepcopy(self.api.objects[self.key])

    async def watch(self, seen: Callable[[str, dict[str, Any] | None], None]) -> None:
        self._check()
        self.watchers.append(seen)
        if self.lease is not None:
            seen("ADDED", self.api.get(*self.key))
        try:
            await asyncio.Event().wait()  # until cancelled
        finally:
            self.watchers.remove(seen)


class FakeAgentApi:
    """The store as the firewall agent calls it (deathwatch.firewall.kubeapi.Api)."""

    COLLECTIONS: Mapping[str, str] = {
        "/api/v1/pods": "pods",
        "/api/v1/nodes": "nodes",
        "/apis/deathwatch.dev/v1alpha1/deathwatches": "deathwatches",
    }

    def __init__(self, api: FakeApi) -> None:
        self.api = api

    def _called(self, method: str, path: str) -> None:
        self.api.requests.append((method, path))
        if self.api.down:
            raise NoAnswer(f"{method} {path}: connection refused")

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        self._called(method, path)
        if (method, path) == ("GET", "/version"):  # the exits container's warm-up
            return {"major": "1", "minor": "37", "gitVersion": "v1.37.2"}
        if path.startswith(DAEMONSET_PATH) and method == "GET":  # its own, as it stops
            ds_namespace, ds_plural, ds_name = path[len(DAEMONSET_PATH) :].split("/")
            assert ds_plural == "daemonsets", path
            return self._found("daemonsets", ds_namespace, ds_name)
        assert path.startswith(LEASE_PATH), path  # the agent's only objects: its Lease
        namespace, plural, *name = path[len(LEASE_PATH) :].split("/")
        assert plural == LEASES, path
        if method == "GET":
            return self._found(LEASES, namespace, name[0])
        assert body is not None
        obj: dict[str, Any] = json.loads(json.dumps(body))
        key = (LEASES, namespace, obj["metadata"]["name"])
        current = self.api.objects.get(key)
        if method == "POST" and current is not None:
            raise ApiError(409, "AlreadyExists")
        if method == "PUT" and (current is None or obj["metadata"].get("resourceVersion")
                                != current["metadata"]["resourceVersion"]):  # fmt: skip
            raise ApiError(404 if current is None else 409, "NotFound or Conflict")
        self.api.add(LEASES, namespace, obj)
        return self.api.get(*key)

    def _found(self, plural: str, namespace: str, name: str) -> dict[str, Any]:
        found = self.api.get(plural, namespace, name)
        if found is None:
            raise ApiError(404, "NotFound")
        return found

    def get(self, path: str, params: Mapping[str, str | int]) -> bytes:
        self._called("GET", path + query(**params))
        plural = self.COLLECTIONS[path]
        items = [copy.deepcopy(o) for (p, _, _), o in sorted(self.api.objects.items())
                 if p == plural and _selected(o, params)]  # fmt: skip
        listing = {"items": items, "metadata": {"resourceVersion": str(self.api._rv)}}
        return json.dumps(listing).encode()

    @contextlib.contextmanager
    def lines(
        self, path: str, params: Mapping[str, str | int], seconds: float
    ) -> Iterator[Iterator[bytes]]:
        self._called("WATCH", path + query(**params))
        if not self.api.streams[path]:
            raise ApiError(500, "InternalError")
        batch = self.api.streams[path].pop(0)
        yield iter([json.dumps(event).encode() + b"\n" for event in batch])


def _selected(obj: Mapping[str, Any], params: Mapping[str, str | int]) -> bool:
    """The two selectors the agent sends: spec.nodeName=..., and label equalities."""
    field = str(params.get("fieldSelector") or "")
    if field:
        key, _, value = field.partition("=")
        assert key == "spec.nodeName", field
        if (obj.get("spec") or {}).get("nodeName") != value:
            return False
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, str(params.get("labelSelector") or "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True
