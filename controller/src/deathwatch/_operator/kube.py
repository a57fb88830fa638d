"""Kubernetes API access for the operator: every call has a deadline and runs off the loop.

The `kubernetes` client is synchronous; each `Api` owns a thread pool and its own connection
pool, so a slow call never blocks the event loop, and two `Api`s (the controller's writes,
/readyz's probe) never queue behind each other. Every call carries `_request_timeout`
(connect, read): a silently dropped TCP connection fails within 30 s instead of hanging
forever while /healthz stays green (field note: that is exactly how a background loop hung).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config, watch

from deathwatch._operator.resources import GROUP, VERSION

API_TIMEOUT = 30.0
REQUEST_TIMEOUT = (10.0, API_TIMEOUT)  # (connect, read) seconds, for every client call
T = TypeVar("T")


def load_configuration(kubeconfig: str | None) -> client.Configuration:
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(client_configuration=configuration)
    return configuration


class Api:
    """A kubernetes ApiClient with its own threads; `await api.call(fn, ...)`."""

    def __init__(
        self, configuration: client.Configuration, threads: int, name: str, identity: str = ""
    ) -> None:
        configuration.connection_pool_maxsize = threads
        configuration.retries = (
            0  # the writer retries with backoff; urllib3's 3 quick ones only add noise
        )
        self.client = client.ApiClient(configuration)
        # every request names the replica (audit logs; field managers say it for writes)
        self.client.user_agent = f"deathwatch/{identity or 'controller'} ({name})"
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self.core = client.CoreV1Api(self.client)
        self.custom = client.CustomObjectsApi(self.client)
        self.apps = client.AppsV1Api(self.client)
        self.version = client.VersionApi(self.client)
        self.coordination = client.CoordinationV1Api(self.client)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT)
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))
        # the socket timeouts end the call; this bounds the wait even if they somehow do not
        return await asyncio.wait_for(future, API_TIMEOUT + REQUEST_TIMEOUT[0] + 5)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


class Fenced(Exception):
    """A write was not sent: this replica could no longer prove it holds the lease."""


class ApiWrites:
    """The writer's four calls (writer.WriteApi) on the real API, each with its deadline,
    each checked against `may_write` in the calling thread right before the request goes out
    (leader.py: a fenced leader sends nothing more, not even what was already on its way),
    and each signed with `field_manager` (the replica: any write can be traced to it)."""

    def __init__(
        self, api: Api, may_write: Callable[[], bool] = lambda: True, field_manager: str = ""
    ) -> None:
        self.api = api
        self.may_write = may_write
        self.field_manager = field_manager or "deathwatch"

    def _guarded(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if not self.may_write():
                raise Fenced("not sent: the lease can no longer be proven")
            return fn(*args, field_manager=self.field_manager, **kwargs)

        return call

    async def create(self, plural: str, namespace: str, body: dict[str, Any]) -> str:
        create = self._guarded(self.api.custom.create_namespaced_custom_object)
        created = await self.api.call(create, GROUP, VERSION, namespace, plural, body)
        return _version(created)

    async def patch_status(
        self, plural: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> str:
        patch_status = self._guarded(self.api.custom.patch_namespaced_custom_object_status)
        patched = await self.api.call(patch_status, GROUP, VERSION, namespace, plural, name, patch)
        return _version(patched)

    async def delete(
        self, plural: str, namespace: str, name: str, resource_version: str | None
    ) -> None:
        delete = self._guarded(self._delete)
        options = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(resource_version=resource_version)
            if resource_version
            else None
        )
        await self.api.call(delete, GROUP, VERSION, namespace, plural, name, body=options)

    def _delete(self, *args: Any, field_manager: str, **kwargs: Any) -> Any:
        # a delete records no manager (DeleteOptions has none): the audit log has the caller
        return self.api.custom.delete_namespaced_custom_object(*args, **kwargs)

    async def get_status(
        self, plural: str, namespace: str, name: str
    ) -> tuple[dict[str, Any], str] | None:
        get = self.api.custom.get_namespaced_custom_object_status
        try:
            obj = await self.api.call(get, GROUP, VERSION, namespace, plural, name)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(obj.get("status") or {}), _version(obj)

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        create_event = self._guarded(self.api.core.create_namespaced_event)
        await self.api.call(create_event, namespace, body)


def _version(obj: Any) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


class ApiLease:
    """The elector's three calls on its Lease (leader.LeaseApi), on their own client, each
    bounded by `timeout` seconds (a renewal must not outlive the renew deadline)."""

    def __init__(
        self, api: Api, name: str, namespace: str, timeout: float, field_manager: str
    ) -> None:
        self.api = api
        self.name, self.namespace = name, namespace
        self.timeout = (min(5.0, timeout), timeout)
        self.leases = client.CoordinationV1Api(api.client)
        self.field_manager = field_manager

    def _dict(self, obj: Any) -> dict[str, Any]:
        out: dict[str, Any] = self.api.client.sanitize_for_serialization(obj)
        return out

    async def get(self) -> dict[str, Any] | None:
        try:
            lease = await self.api.call(
                self.leases.read_namespaced_lease, self.name, self.namespace,
                _request_timeout=self.timeout,
            )  # fmt: skip
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return self._dict(lease)

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        lease = await self.api.call(
            self.leases.create_namespaced_lease, self.namespace, body,
            field_manager=self.field_manager, _request_timeout=self.timeout,
        )  # fmt: skip
        return self._dict(lease)

    async def replace(self, body: dict[str, Any]) -> dict[str, Any]:
        lease = await self.api.call(
            self.leases.replace_namespaced_lease, self.name, self.namespace, body,
            field_manager=self.field_manager, _request_timeout=self.timeout,
        )  # fmt: skip
        return self._dict(lease)

    async def watch(
        self, seen: Callable[[str, dict[str, Any] | None], None], seconds: int = 60
    ) -> None:
        """One watch of the Lease by name (RBAC: list and watch on that name), ended by the
        server after `seconds`; `seen(type, lease)` runs on the event loop for each event.
        The blocking read runs on a daemon thread of its own: it never takes the renewals'
        thread, and a process that is stopping never waits for it."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()
        stream = watch.Watch()

        def deliver(event_type: str, lease: dict[str, Any] | None) -> None:
            if not ended.done():
                seen(event_type, lease)

        def finish(error: BaseException | None) -> None:
            if ended.done():
                return
            if error is None:
                ended.set_result(None)
            else:
                ended.set_exception(error)

        def follow() -> None:
            error: BaseException | None = None
            try:
                for event in stream.stream(
                    self.leases.list_namespaced_lease, self.namespace,
                    field_selector=f"metadata.name={self.name}", timeout_seconds=seconds,
                    _request_timeout=(self.timeout[0], seconds + 15), deserialize=False,
                ):  # fmt: skip
                    loop.call_soon_threadsafe(deliver, event["type"], event["object"])
            except Exception as exc:
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting
                loop.call_soon_threadsafe(finish, error)

        threading.Thread(target=follow, name="lease-watch", daemon=True).start()
        try:
            await ended
        finally:
            stream.stop()  # cancelled: the thread ends at its next event or the server's end


def status_code(exc: BaseException) -> str:
    """A short label for an API failure, for metrics and logs: the HTTP status, `timeout`
    (no answer in time), `connection` (refused, reset, broken), else the error's type."""
    if isinstance(exc, client.ApiException):
        return str(exc.status)
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        return status_code(exc.reason)
    if isinstance(exc, urllib3.exceptions.NewConnectionError | ConnectionError):
        return "connection"  # (urllib3 makes NewConnectionError a kind of connect timeout)
    if isinstance(exc, TimeoutError | asyncio.TimeoutError | urllib3.exceptions.TimeoutError):
        return "timeout"
    if isinstance(exc, urllib3.exceptions.ProtocolError | urllib3.exceptions.SSLError):
        return "connection"
    return type(exc).__name__


def retryable(exc: BaseException) -> bool:
    """Whether a failed call can succeed later. 403 counts: it is a configuration error (the
    caller logs it as one) but also what a restarting apiserver answers until its RBAC
    caches fill."""
    if isinstance(exc, client.ApiException):
        return exc.status in (0, 403, 408, 429) or exc.status >= 500
    return True  # connection refused/reset, timeouts: the API may come back


def api_message(exc: BaseException) -> str:
    if isinstance(exc, client.ApiException):
        try:
            return str(json.loads(exc.body or "{}").get("message") or exc.reason)
        except ValueError:
            return str(exc.reason)
    return str(exc) or type(exc).__name__
