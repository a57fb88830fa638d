"""The preflight's reads: each a GET or a paged list, each within the API client's deadline.
/version must answer (else nothing can be said, and the command says why); any other read the
role may not make (403) is noted and its checks skipped; a 404 is an answer (not there)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from deathwatch._api.resources import DW_PLURAL, GROUP, VERSION
from deathwatch._api.rest import Rest
from deathwatch._kube.errors import ApiError
from deathwatch._preflight.checks import DEATHWATCH_CRD, SANDBOX_CRD, Cluster

PAGE = 500
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
RUNTIME_CLASSES = "/apis/node.k8s.io/v1/runtimeclasses"


async def read_cluster(rest: Rest) -> Cluster:
    cluster = Cluster(version=await _get(rest, "/version"))

    async def listed(what: str, path: str) -> list[Mapping[str, Any]] | None:
        try:
            return await _list(rest, path)
        except ApiError as exc:
            if exc.unauthorized:
                raise
            cluster.unreadable[what] = f"{exc.status}: {exc.message}"
            return None

    async def got(what: str, path: str) -> Mapping[str, Any] | None:
        try:
            return await _get(rest, path)
        except ApiError as exc:
            if exc.not_found:
                return None
            if exc.unauthorized:
                raise
            cluster.unreadable[what] = f"{exc.status}: {exc.message}"
            return None

    cluster.nodes = await listed("nodes", "/api/v1/nodes")
    cluster.pods = await listed("pods", "/api/v1/pods")
    cluster.daemonsets = await listed("daemonsets", "/apis/apps/v1/daemonsets")
    cluster.runtime_classes = await listed("runtimeclasses", RUNTIME_CLASSES)
    cluster.kube_proxy = await got(
        "configmaps", "/api/v1/namespaces/kube-system/configmaps/kube-proxy"
    )
    cluster.cilium = await got(
        "configmaps", "/api/v1/namespaces/kube-system/configmaps/cilium-config"
    )
    crds: set[str] | None = set()
    for name in (DEATHWATCH_CRD, SANDBOX_CRD):
        if (
            await got("customresourcedefinitions", f"{CRDS}/{name}") is not None
            and crds is not None
        ):
            crds.add(name)
        if "customresourcedefinitions" in cluster.unreadable:
            crds = None
    cluster.crds = crds
    if crds is not None and DEATHWATCH_CRD in crds:
        cluster.deathwatches = await listed("deathwatches", f"/apis/{GROUP}/{VERSION}/{DW_PLURAL}")
    return cluster


async def _get(rest: Rest, path: str) -> Mapping[str, Any]:
    body = json.loads(await rest.request("GET", path))
    return body if isinstance(body, dict) else {}


async def _list(rest: Rest, path: str) -> list[Mapping[str, Any]]:
    """Every item, in pages of PAGE (a continue token that expires lists again from the start)."""
    items: list[Mapping[str, Any]] = []
    token = ""
    while True:
        params: dict[str, str | int] = {"limit": PAGE}
        if token:
            params["continue"] = token
        try:
            body = json.loads(await rest.request("GET", path, params=params))
        except ApiError as exc:
            if exc.gone and token:  # the continue token expired: from the start
                items, token = [], ""
                continue
            raise
        items.extend(i for i in body.get("items") or [] if isinstance(i, dict))
        token = (body.get("metadata") or {}).get("continue") or ""
        if not token:
            return items
