"""Which sandboxes run on this node: their addresses, for the inbound rule.

`addresses` is pure: a pod list in, the IPs of the running sandbox pods out. A pod that has
finished (Succeeded/Failed) is left out at once, since its address can be given to another
pod; a hostNetwork pod has the node's address and is no sandbox of ours.

`PodWatch` only wakes the agent: any change to a sandbox pod on this node ends its wait, and
the agent lists again (a list per change on one node is cheap, and there is no watch state to
get wrong). A broken watch, whatever broke it, is retried with capped backoff, counted
(deathwatch_firewall_sync_failures{reason="watch"}) and logged: the thread never ends before
the agent does; meanwhile the agent still lists at every resync.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from deathwatch.firewall.kubeapi import Api, query
from deathwatch.firewall.ruleset import Address

log = structlog.get_logger("deathwatch.firewall")
WATCH_SECONDS = 300
BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0)


def pods_path(node: str, selector: str) -> str:
    return "/api/v1/pods" + query(fieldSelector=f"spec.nodeName={node}", labelSelector=selector)


def addresses(pod_list: Mapping[str, Any]) -> tuple[Address, ...]:
    found: set[Address] = set()
    for pod in pod_list.get("items") or []:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if spec.get("hostNetwork") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        ips = [p.get("ip") for p in status.get("podIPs") or []] or [status.get("podIP")]
        for ip in ips:
            try:
                found.add(ipaddress.ip_address(ip))
            except (TypeError, ValueError):
                continue  # not assigned yet
    return tuple(sorted(found, key=lambda a: (a.version, int(a))))


def list_sandboxes(api: Api, node: str, selector: str) -> tuple[Address, ...]:
    return addresses(api.call("GET", pods_path(node, selector)))


class PodWatch:
    """Calls `wake()` on every change to a sandbox pod of this node, until stopped."""

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
        failures = 0
        while not self.stop.is_set():
            try:
                for event in self.api.watch(pods_path(self.node, self.selector()), WATCH_SECONDS):
                    if event.get("type") == "ERROR":  # e.g. 410: start a new watch
                        self.failed()
                        log.info("pod watch ended", error=str(event.get("object"))[:200])
                        break
                    failures = 0
                    self.wake()
                    if self.stop.is_set():
                        return
            except Exception as exc:  # any failure, a cut chunked read too: retried
                self.failed()
                delay = BACKOFF[min(failures, len(BACKOFF) - 1)]
                failures += 1
                log.warning("pod watch failed; retrying", error=f"{type(exc).__name__}: "
                            f"{str(exc)[:300]}", retry_in=delay)  # fmt: skip
                self.stop.wait(delay)
