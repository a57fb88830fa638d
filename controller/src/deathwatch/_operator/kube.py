"""Kubernetes API access for the operator: every call has a deadline and runs off the loop.

The `kubernetes` client is synchronous; each `Api` owns a thread pool and its own connection
pool, so a slow call never blocks the event loop, and two `Api`s (the controller's writes,
/readyz's probe) never queue behind each other. Every call carries `_request_timeout`
(connect, read): a silently dropped TCP connection fails within 30 s instead of hanging
forever while /healthz stays green (field note: that is exactly how a background loop hung).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config

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

    def __init__(self, configuration: client.Configuration, threads: int, name: str) -> None:
        configuration.connection_pool_maxsize = threads
        configuration.retries = (
            0  # the writer retries with backoff; urllib3's 3 quick ones only add noise
        )
        self.client = client.ApiClient(configuration)
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self.core = client.CoreV1Api(self.client)
        self.custom = client.CustomObjectsApi(self.client)
        self.apps = client.AppsV1Api(self.client)
        self.version = client.VersionApi(self.client)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT)
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))
        # the socket timeouts end the call; this bounds the wait even if they somehow do not
        return await asyncio.wait_for(future, API_TIMEOUT + REQUEST_TIMEOUT[0] + 5)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


class ApiWrites:
    """The writer's four calls (writer.WriteApi) on the real API, each with its deadline."""

    def __init__(self, api: Api) -> None:
        self.api = api

    async def create(self, plural: str, namespace: str, body: dict[str, Any]) -> None:
        custom = self.api.custom
        await self.api.call(
            custom.create_namespaced_custom_object, GROUP, VERSION, namespace, plural, body
        )

    async def patch_status(
        self, plural: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> None:
        custom = self.api.custom
        await self.api.call(
            custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            plural,
            name,
            patch,
        )

    async def delete(self, plural: str, namespace: str, name: str) -> None:
        custom = self.api.custom
        await self.api.call(
            custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, plural, name
        )

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        await self.api.call(self.api.core.create_namespaced_event, namespace, body)


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
