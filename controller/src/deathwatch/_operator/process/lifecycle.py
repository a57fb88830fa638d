"""kopf keeps the process's life: login, start-up and clean-up call the app; kopf itself
watches nothing (every watch is a reflector: ADR 0014), posts nothing and peers with nobody
(the Lease elects the writer: ADR 0011)."""

from __future__ import annotations

import os
from typing import Any

import kopf

from deathwatch._operator.process.app import App


def configure(settings: kopf.OperatorSettings) -> None:
    settings.posting.enabled = False  # our Events are posted by the writer, once each
    settings.peering.standalone = True  # no kopf peering: the Lease elects the writer (ADR 0011)
    settings.scanning.disabled = True  # kopf watches nothing: every watch is a reflector
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10


def register(registry: kopf.OperatorRegistry, app: App) -> None:
    """Attach the handlers to a kopf registry. Small and declarative: the work is elsewhere."""

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # The same as our own client (kube.load_configuration): --kubeconfig if given, else
        # in a pod the Service address from the environment, as client-go does (kopf's own
        # service-account login asks DNS for kubernetes.default.svc; no DNS, no controller).
        if app.config.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return kopf.login_via_client(**kwargs)
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(id="startup", registry=registry, backoff=2)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings)
        await app.start()

    @kopf.on.cleanup(id="cleanup", registry=registry)
    async def cleanup(**_: Any) -> None:
        await app.stop()
