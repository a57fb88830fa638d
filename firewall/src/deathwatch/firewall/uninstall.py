"""Whether a stopping agent is being uninstalled, or only replaced.

A DaemonSet rollout, a node drain and an uninstall all end an agent the same way: SIGTERM.
Only the first two must leave the table in force (a rollout must never open the hole, not
even between two pods), so the agent asks the one object that tells them apart, its own
DaemonSet: an uninstall (`helm uninstall`, `firewall.enabled=false`, Argo CD or Flux pruning,
`kubectl delete`) has deleted it (background propagation: it is gone before its pods are
told to stop) or is deleting it (foreground: `deletionTimestamp` set). A rollout or a drain
leaves it standing.

By the time the agent is told to stop, an uninstall has usually deleted the agent's RBAC
too (Helm deletes the DaemonSet, then the roles, a few milliseconds apart; the pods go after
both), so a read at stop is refused. An open watch is not: the API server authorizes a watch
when it starts, and keeps streaming after its grant is gone. So `DaemonSetWatch` follows the
DaemonSet for the agent's whole life and remembers its last state; at stop, `assess` reads it
afresh and falls back to that memory only when the read is refused or unanswered.

Anything else keeps the table: neither the read nor the watch can say (the safe side of a
wrong guess is a table left behind; the other side opens sandboxes during a rollout). A
DaemonSet deleted and made again (orphaning its pods, to change its selector) reads as
standing, from the read and from the watch's ADDED alike (ADR 0023).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from deathwatch._kube import backoff
from deathwatch._kube.errors import ApiError, KubeError, describe
from deathwatch._kube.listwatch import Item, Listed, ListWatch, Noted, Output
from deathwatch.firewall.kubeapi import Api, ThreadTransport, follow

log = structlog.get_logger("deathwatch.firewall")
WATCH_SECONDS = 300


@dataclass(frozen=True)
class Assessment:
    uninstalling: bool
    why: str  # one line for the log


def _path(namespace: str) -> str:
    return f"/apis/apps/v1/namespaces/{namespace}/daemonsets"


def _of(obj: Any, what: str) -> Assessment:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return Assessment(False, f"{what}: an answer with no metadata")
    if meta.get("deletionTimestamp"):
        return Assessment(True, f"{what} is being deleted")
    return Assessment(False, f"{what} stands (a rollout or a drain)")


class DaemonSetWatch:
    """The agent's own DaemonSet, as last seen on a watch of it (list/watch with
    `metadata.name`): `seen` is None until it is first listed. Its thread never ends before
    the agent does; a failure is counted (`failed()`) and retried."""

    def __init__(self, api: Api, namespace: str, name: str, failed: Callable[[], None],
                 stop: threading.Event) -> None:  # fmt: skip
        self.api, self.namespace, self.name = api, namespace, name
        self.failed, self.stop = failed, stop
        self.what = f"DaemonSet {namespace}/{name}"
        self.seen: Assessment | None = None

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="daemonset-watch", daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        transport = ThreadTransport(self.api, _path(self.namespace), self.stop, WATCH_SECONDS + 30)
        protocol = ListWatch(field_selector=f"metadata.name={self.name}",
                             server_timeout=WATCH_SECONDS, backoff=backoff.NODE_WATCH)  # fmt: skip
        while not self.stop.is_set():
            try:
                follow(protocol, transport, self.handle)
            except Exception:  # a bug: counted, logged with its traceback, started again
                self.failed()
                log.exception("daemonset watch failed; starting it again")
                self.stop.wait(backoff.NODE_WATCH[-1])

    def handle(self, out: Output) -> bool:
        if isinstance(out, Item):
            if out.type == "DELETED":
                self.seen = Assessment(True, f"{self.what} was deleted (seen on its watch)")
            else:
                self.seen = _of(json.loads(bytes(out.raw)), f"{self.what} (on its watch)")
        elif isinstance(out, Listed):
            if out.count == 0:  # listed by its name, and it is not there
                self.seen = Assessment(True, f"{self.what} is gone (listed on its watch)")
        elif isinstance(out, Noted) and out.error is not None:
            self.failed()
            log.warning("daemonset watch failed; retrying", error=describe(out.error)[:300],
                        retry_in=out.retry_in)  # fmt: skip
        return True


def assess(
    api: Api, namespace: str, name: str, watched: DaemonSetWatch | None = None
) -> Assessment:
    """Read the agent's DaemonSet once (the API client's own deadline bounds it); when the
    read is refused or unanswered, what its watch saw last."""
    what = f"DaemonSet {namespace}/{name}"
    try:
        found = api.call("GET", f"{_path(namespace)}/{name}")
    except KubeError as exc:
        if isinstance(exc, ApiError) and exc.not_found:
            return Assessment(True, f"{what} is gone")
        unread = f"cannot read {what}: {describe(exc)[:200]}"
        if watched is not None and watched.seen is not None:
            return Assessment(watched.seen.uninstalling, f"{unread}; {watched.seen.why}")
        return Assessment(False, f"{unread}; its watch saw nothing")
    return _of(found, what)
