"""Run `deathwatch controller` as a real process (as in a Pod), for tests and the demo."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from hack.localcluster.controlplane import ControlPlane, free_port, kubeconfig

ROOT = Path(__file__).resolve().parent.parent.parent


def service_account_token(api: client.ApiClient, namespace: str, name: str) -> str:
    """A TokenRequest token of the ServiceAccount (an hour), as its Pod would be given."""
    core = client.CoreV1Api(api)
    token: str = core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 3600}}, _request_timeout=30
    ).status.token
    return token


def service_account_kubeconfig(
    cp: ControlPlane,
    api: client.ApiClient,
    namespace: str,
    name: str,
    path: Path,
    server: str | None = None,
) -> Path:
    """A kubeconfig holding a TokenRequest token of the ServiceAccount: the controller then
    runs with exactly the RBAC its manifests grant, as it would in its Pod. `server` replaces
    the apiserver's address (a chaos proxy in front of it)."""
    token = service_account_token(api, namespace, name)
    path.write_text(
        kubeconfig(server or cp.server, cp.certs / "ca.crt", None, None, token=token, user=name)
    )
    return path


# a test scaffold, not part of any install: no "deathwatch" in its cluster-wide binding's name
# (the uninstall lanes check that nothing named so is left)
READER = ("deathwatch-system", "metrics-test-reader")


class MetricsRefused(RuntimeError):
    """/metrics answered with a refusal, not the page."""


def metrics_reader_token(api: client.ApiClient) -> str:
    """A token that may read the controller's /metrics and /readyz: a ServiceAccount bound to
    the ClusterRole deathwatch-metrics-reader (manifests/base/rbac/metrics-reader.yaml, which
    must be applied), as Prometheus's would be."""
    namespace, name = READER
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    with contextlib.suppress(client.ApiException):  # 409: made by an earlier test
        core.create_namespaced_service_account(namespace, {"metadata": {"name": name}},
                                               _request_timeout=30)  # fmt: skip
    with contextlib.suppress(client.ApiException):
        rbac.create_cluster_role_binding({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "deathwatch-metrics-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        }, _request_timeout=30)  # fmt: skip
    return service_account_token(api, namespace, name)


def unverified() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the controller's self-signed serving certificate
    return context


class ControllerProcess:
    """`deathwatch controller` as a process: its metrics port (HTTPS: /metrics and /readyz's
    details with `reader_token`) and its health port (HTTP: /healthz) on loopback.
    `open_files`: its (soft, hard) RLIMIT_NOFILE, e.g. containerd 2.x's (1024, 524288)."""

    def __init__(
        self,
        kubeconfig_path: Path,
        namespaces: list[str],
        log: Path,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
        reader_token: str | None = None,
        open_files: tuple[int, int] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig_path
        self.namespaces = namespaces
        self.log = log
        self.extra = extra or []
        self.env = env or {}
        self.reader_token = reader_token
        self.open_files = open_files
        self.port = free_port()  # the metrics port (HTTPS)
        self.health_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The metrics port."""
        return f"https://127.0.0.1:{self.port}"

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}"

    def start(self, timeout: float = 30) -> ControllerProcess:
        args = [
            sys.executable,
            "-m",
            "deathwatch._cli",
            "controller",
            "--kubeconfig",
            str(self.kubeconfig),
        ]
        args += ["--metrics-address", f"127.0.0.1:{self.port}",
                 "--health-address", f"127.0.0.1:{self.health_port}"]  # fmt: skip
        for ns in self.namespaces:
            args += ["--namespace", ns]
        if not any("leader-elect" in a for a in self.extra):
            args.append("--no-leader-elect")  # the only writer, unless a test elects replicas
        args += self.extra
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        limits = self.open_files

        def limited() -> None:
            if limits is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, limits)

        with self.log.open("ab") as logf:
            self.proc = subprocess.Popen(
                args, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                preexec_fn=limited if limits is not None else None,  # noqa: PLW1509 - setrlimit only
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"controller exited with {self.proc.returncode}:\n{self.tail()}")
            if self.get("/healthz", status_only=True) == 200:
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"controller not healthy within {timeout}s:\n{self.tail()}")
        # the reader scrapes once, as Prometheus does from the start: a known reader, whose
        # later reads never wait on a review (ADR 0020)
        while self.reader_token and self.get("/metrics", status_only=True) != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"/metrics not readable within {timeout}s:\n{self.tail()}")
            time.sleep(0.1)
        return self

    def get(self, path: str, status_only: bool = False) -> Any:
        """/healthz from the health port; /metrics and /readyz from the metrics port, with
        the reader's token (without one: what anyone gets)."""
        if path == "/healthz":
            request = urllib.request.Request(self.health_url + path)  # noqa: S310 - loopback
            context = None
        else:
            request = urllib.request.Request(self.url + path)  # noqa: S310 - loopback
            if self.reader_token:
                request.add_header("Authorization", f"Bearer {self.reader_token}")
            context = unverified()
        try:
            with urllib.request.urlopen(request, timeout=5, context=context) as resp:  # noqa: S310
                body = resp.read()
                status = resp.status
        except urllib.error.HTTPError as exc:
            body, status = exc.read(), exc.code
        except OSError:
            return None
        if status_only:
            return status
        text = body.decode()
        return json.loads(text) if path == "/readyz" and self.reader_token else text

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a sample's values (e.g. `deathwatch_api_writes_total`) over the series
        whose labels include `labels` (0 if none). A page that is not the metrics (a refusal:
        401, 403, 503) raises, saying what came instead."""
        page = self.get("/metrics") or ""
        if page and not page.startswith("#"):
            raise MetricsRefused(f"/metrics answered: {page.strip()[:200]}")
        return sum(
            sample.value
            for family in text_string_to_metric_families(page)
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        code = self.proc.returncode
        self.proc = None
        return code

    def kill(self) -> None:
        """SIGKILL: no cleanup, no flush: what an OOM kill or a node loss does."""
        self.stop(signal.SIGKILL)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
