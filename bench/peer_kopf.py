"""Two kopf operators a platform team might write instead of deathwatch (bench/peers.py).

    PEER_MODE=naive|noop kopf run --standalone --namespace NS bench/peer_kopf.py

- naive: `on.field` on the pod's status.conditions; when Ready changes, it annotates the pod
  with the new value (one patch, which also carries kopf's own diff-base annotation).
- noop: `on.event` that does nothing: the framework's own cost of watching the pods.
Both get the server-side label selector deathwatch uses (app=sandbox).
"""

from __future__ import annotations

import os
from typing import Any

import kopf

MODE = os.environ.get("PEER_MODE", "noop")
ANNOTATION = "bench.deathwatch.dev/ready"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.enabled = False
    settings.scanning.disabled = True
    settings.networking.request_timeout = 30
    settings.watching.label_selectors["pods"] = "app=sandbox"


def _ready(conditions: Any) -> str | None:
    for condition in conditions or []:
        if condition.get("type") == "Ready":
            return str(condition.get("status"))
    return None


if MODE == "naive":

    @kopf.on.field("", "v1", "pods", field="status.conditions")
    def ready_changed(new: Any, patch: kopf.Patch, **_: Any) -> None:
        ready = _ready(new)
        if ready is not None:
            patch.metadata.annotations[ANNOTATION] = ready

else:

    @kopf.on.event("", "v1", "pods")
    def noop(**_: Any) -> None:
        pass
