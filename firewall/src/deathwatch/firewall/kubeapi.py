"""The few Kubernetes API calls the agent makes, over the standard library.

The agent lists the sandbox pods of its own node and keeps one Lease saying that the node is
shielded. Four verbs on two resources do not justify the kubernetes client (and its
dependencies) in a privileged hostNetwork image (docs/adr/0012). Every call has a deadline
(`TIMEOUT`, the field notes' 30 s cap); the token is read again for each call, because
projected ServiceAccount tokens rotate.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

TIMEOUT = 30.0
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class Api(Protocol):
    """What the agent needs of the API (KubeApi here; a fake in unit tests)."""

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any: ...

    def watch(self, path: str, seconds: int) -> Iterator[Mapping[str, Any]]: ...


class ApiError(RuntimeError):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class KubeApi:
    server: str  # https://host:port
    token_file: Path
    ca_file: Path | None
    timeout: float = TIMEOUT

    @staticmethod
    def in_cluster() -> KubeApi:
        host, port = (
            os.environ.get("KUBERNETES_SERVICE_HOST"),
            os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
        )
        if not host:
            raise ApiError("not in a cluster: KUBERNETES_SERVICE_HOST is not set")
        if ":" in host:
            host = f"[{host}]"
        return KubeApi(
            f"https://{host}:{port}", SERVICE_ACCOUNT / "token", SERVICE_ACCOUNT / "ca.crt"
        )

    def _context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)

    def _request(
        self, method: str, path: str, body: Mapping[str, Any] | None, timeout: float
    ) -> Any:
        try:
            token = self.token_file.read_text().strip()
        except OSError as exc:
            raise ApiError(f"cannot read the token {self.token_file}: {exc.strerror}") from None
        if not self.server.startswith("https://"):
            raise ApiError(f"{self.server}: only https is spoken to the API")
        request = urllib.request.Request(  # noqa: S310 - https only (checked above)
            self.server + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "Content-Type": "application/json",
                "User-Agent": "deathwatch-firewall",
            },
        )
        try:
            return urllib.request.urlopen(request, timeout=timeout, context=self._context())  # noqa: S310
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace")
            raise ApiError(f"{method} {path}: {exc.code} {detail}", exc.code) from None
        except (urllib.error.URLError, OSError, ssl.SSLError) as exc:
            raise ApiError(f"{method} {path}: {getattr(exc, 'reason', exc)}") from None

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        with self._request(method, path, body, self.timeout) as response:
            try:
                return json.loads(response.read())
            except (ValueError, OSError) as exc:
                raise ApiError(f"{method} {path}: unreadable answer: {exc}") from None

    def watch(self, path: str, seconds: int) -> Iterator[Mapping[str, Any]]:
        """The events of one watch, ended by the server after `seconds`; a silent connection
        is cut after `seconds + 30` (the socket timeout), so nothing waits forever."""
        sep = "&" if "?" in path else "?"
        url = f"{path}{sep}watch=1&timeoutSeconds={seconds}"
        with self._request("GET", url, None, seconds + self.timeout) as response:
            for line in response:
                try:
                    yield json.loads(line)
                except ValueError:
                    raise ApiError(f"watch {path}: unreadable event {line[:100]!r}") from None


def query(**params: str) -> str:
    return "?" + urllib.parse.urlencode({k: v for k, v in params.items() if v})
