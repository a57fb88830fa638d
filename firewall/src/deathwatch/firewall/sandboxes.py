"""Which sandboxes run on this node: their addresses, for the inbound rule.

A sandbox is a pod a DeathWatch selects (deathwatches.py, ADR 0037): the agent lists every pod
of its node and keeps those; an operator's `sandboxSelector`, where given, chooses instead.
`addresses` is pure: a pod list in, the IPs of the running sandbox pods out. A pod that has
finished (Succeeded/Failed) is left out at once, since its address can be given to another
pod; a hostNetwork pod has the node's address and is no sandbox of ours.

`PodWatch` only wakes the agent: any change to a sandbox pod on this node ends its wait, and
the agent lists again (a list per change on one node is cheap, and there is no watch state to
get wrong). A broken watch is resumed by the list/watch protocol, with capped backoff, counted
(deathwatch_firewall_sync_failures{reason="watch"}) and logged: the thread never ends before
the agent does; meanwhile the agent still lists at every resync.
"""

from __future__ import annotations

import ipaddress
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from deathwatch._kube import backoff
from deathwatch._kube.errors import describe
from deathwatch._kube.listwatch import Item, Listed, ListWatch, Noted, Output
from deathwatch._kube.selection import Selection
from deathwatch.firewall.kubeapi import Api, ThreadTransport, follow
from deathwatch.firewall.ruleset import Address

log = structlog.get_logger("deathwatch.firewall")
WATCH_SECONDS = 300


PODS = "/api/v1/pods"


def pod_params(node: str, selector: str) -> dict[str, str | int]:
    params: dict[str, str | int] = {"fieldSelector": f"spec.nodeName={node}"}
    if selector:
        params["labelSelector"] = selector
    return params


def addresses(pod_list: Mapping[str, Any], chosen: Sequence[Selection] | None = None
              ) -> tuple[Address, ...]:  # fmt: skip
    """The addresses of the running sandbox pods listed; with `chosen`, only of the pods one
    of those DeathWatches selects (none: the list was made by the operator's selector)."""
    found: set[Address] = set()
    for pod in pod_list.get("items") or []:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if spec.get("hostNetwork") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        if chosen is not None and not any(s.selects(pod) for s in chosen):
            continue
        ips = [p.get("ip") for p in status.get("podIPs") or []] or [status.get("podIP")]
        for ip in ips:
            try:
                found.add(ipaddress.ip_address(ip))
            except (TypeError, ValueError):
                continue  # not assigned yet
    return tuple(sorted(found, key=lambda a: (a.version, int(a))))


def list_sandboxes(api: Api, node: str, selector: str,
                   chosen: Sequence[Selection] | None = None) -> tuple[Address, ...]:  # fmt: skip
    """This node's sandboxes: the pods `selector` selects, or (no selector) those one of the
    `chosen` DeathWatches selects, of every pod on the node."""
    return addresses(json.loads(api.get(PODS, pod_params(node, selector))), chosen)


class PodWatch:
    """Calls `wake()` on every change to a sandbox pod of this node, until stopped: the
    list/watch protocol (deathwatch._kube.listwatch) on its pods, started again when the
    sandbox selector changes. Its thread never ends before the agent does."""

    def __init__(
        self,
        api: Api,
        node: str,
        selector: Callable[[], str],
        wake: Callable[[], None],
        failed: Callable[[], None],
        stop: threading.Event,
    ) -> None:
        self.api, self.node, self.selector = api, node, selector
        self.wake, self.failed, self.stop = wake, failed, stop

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="pod-watch", daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        transport = ThreadTransport(self.api, PODS, self.stop, WATCH_SECONDS + 30)
        while not self.stop.is_set():
            selector = self.selector()
            params = pod_params(self.node, selector)
            protocol = ListWatch(
                label_selector=str(params.get("labelSelector") or "") or None,
                field_selector=str(params["fieldSelector"]),
                server_timeout=WATCH_SECONDS, backoff=backoff.NODE_WATCH,
            )  # fmt: skip

            def handle(out: Output, selector: str = selector) -> bool:
                if isinstance(out, Item | Listed):
                    self.wake()
                elif isinstance(out, Noted) and out.error is not None:
                    self.failed()
                    log.warning("pod watch failed; retrying", error=describe(out.error)[:300],
                                retry_in=out.retry_in)  # fmt: skip
                return self.selector() == selector  # a new selector: a new watch

            try:
                follow(protocol, transport, handle)
            except Exception:  # a bug: counted, logged with its traceback, started again
                self.failed()
                log.exception("pod watch failed; starting it again")
                self.stop.wait(backoff.NODE_WATCH[-1])
