"""What a call on the Kubernetes API ends in, when it does not succeed.

Two kinds, and nothing else (httpx's shape: one hierarchy, predicates to ask it):

- `ApiError`: the API server answered with a refusal (an HTTP status of 400 or more), its
  Status object's reason and message;
- `NoAnswer`: no answer came (refused, reset, timed out, a TLS failure, a stream cut in
  the middle).

Each transport (the controller's aiohttp client, the firewall agent's urllib one) raises only
these for what the API or the network did. Anything else raised while calling the API is a
bug of ours: `retryable` says False for it, so no caller retries a programming error forever.
"""

from __future__ import annotations

from typing import Final

import msgspec

# 403 counts as passing: it is usually RBAC (said as such), but it is also what a restarting
# API server answers until its authorization caches fill
RETRYABLE_STATUSES: Final = frozenset({403, 408, 429})


class KubeError(Exception):
    """A call on the Kubernetes API did not succeed."""

    @property
    def retryable(self) -> bool:
        return False

    @property
    def label(self) -> str:
        """A short name for metrics and logs: the HTTP status, `timeout` or `connection`."""
        return type(self).__name__


class _Details(msgspec.Struct):
    name: str = ""


class _Status(msgspec.Struct):
    message: str = ""
    reason: str = ""
    details: _Details | None = None


class ApiError(KubeError):
    """The API server refused a request: its HTTP status, reason and body (a Status)."""

    def __init__(self, status: int, reason: str = "", body: bytes | str = b"") -> None:
        self.status = status
        self.reason = reason
        self.body = body.decode(errors="replace") if isinstance(body, bytes) else body
        super().__init__(
            f"{status} {reason}: {self.message}" if reason else f"{status}: {self.message}"
        )

    def _status(self) -> _Status | None:
        try:
            return msgspec.json.decode(self.body, type=_Status)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None

    @property
    def message(self) -> str:
        """The Status object's message, else the body as it came (cut short)."""
        said = self._status()
        if said is None:
            return self.body[:300]
        return said.message or said.reason or self.body[:300]

    @property
    def missing_resource(self) -> bool:
        """A 404 for the kind of object, not for one object: the API server does not serve
        that resource at all (a CRD not installed). Its Status then names no object."""
        if not self.not_found:
            return False
        said = self._status()
        return said is None or not (said.details and said.details.name)

    @property
    def conflict(self) -> bool:
        """409: the object moved (a stale resourceVersion), or it already exists."""
        return self.status == 409

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def gone(self) -> bool:
        """410: the resourceVersion to resume from was compacted away: list again."""
        return self.status == 410

    @property
    def throttled(self) -> bool:
        """429: too many requests (priority and fairness), or an eviction a budget blocks."""
        return self.status == 429

    @property
    def forbidden(self) -> bool:
        return self.status == 403

    @property
    def unauthorized(self) -> bool:
        """401: the API server does not know who this is (no credentials, or expired ones)."""
        return self.status == 401

    @property
    def server_error(self) -> bool:
        return self.status >= 500

    @property
    def retryable(self) -> bool:
        return self.status in RETRYABLE_STATUSES or self.status >= 500

    @property
    def label(self) -> str:
        return str(self.status)


class NoAnswer(KubeError):
    """No answer: the connection was refused, reset or cut, or a deadline passed."""

    def __init__(self, what: str, *, timeout: bool = False, reason: str = "") -> None:
        super().__init__(what)
        self.timeout = timeout
        self.reason = reason or what  # what the network said, without the request

    @property
    def retryable(self) -> bool:
        return True

    @property
    def label(self) -> str:
        return "timeout" if self.timeout else "connection"


def retryable(exc: BaseException) -> bool:
    """Whether a failed call can succeed later. Only what the API or the network did can:
    an exception of any other type is a bug, and retrying it would hide it for ever."""
    return isinstance(exc, KubeError) and exc.retryable


def label(exc: BaseException) -> str:
    """A short name of a failure for a metric's label: the HTTP status, `timeout`,
    `connection`, or (a bug) the exception's type."""
    return exc.label if isinstance(exc, KubeError) else type(exc).__name__


def describe(exc: BaseException) -> str:
    """One line saying what went wrong, for a log: the API's own message when it refused."""
    if isinstance(exc, ApiError):
        return f"{exc.status}: {exc.message}"
    return str(exc) or type(exc).__name__
