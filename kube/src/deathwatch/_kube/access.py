"""Who may read an endpoint, decided the Kubernetes way: the client's bearer token checked
by the API server (TokenReview), then what that user may do (SubjectAccessReview, a verb on
the endpoint's non-resource URL, as controller-runtime's and kube-rbac-proxy's metrics
do). RBAC then says who reads: the chart's `deathwatch-metrics-reader` ClusterRole.

Every port of deathwatch is reachable from every pod, so a flood of made-up tokens must not
become a flood on the API server:

- each decision is cached by (the token's SHA-256, path): an allowed one for `allowed_for`
  seconds, a refused one (unauthenticated, forbidden) for `refused_for`; at most `entries`
  of them, the least recently used leaving first;
- one review at a time per (token, path): who asks meanwhile waits for the same answer;
- reviews are a budget: at most `concurrent` in flight and `per_second` on average (bursts
  of `burst`). A check that would need a review beyond it is `BUSY` at once (503; not cached),
  so an attack costs the API at most `per_second` reviews a second, and a caller whose
  decision is cached (Prometheus, every scrape after its first) is not held up at all;
- a token allowed before (a known reader: the last `readers` of them) is never held up by its
  decision expiring: it is answered from the expired allowance while it is reviewed again in
  the background (stale-while-revalidate), from a budget of its own (`renewals` a second,
  one at a time), so a flood of made-up tokens cannot starve Prometheus's next review. A
  refusal ends the allowance at once; an API server that does not answer extends it, for at
  most `stale_for` seconds past its expiry: an outage of the API is when its metrics matter
  most. (A reader never allowed before competes for the shared budget during a flood.)
- a review the API does not answer is `UNAVAILABLE` (503; not cached).

A request with no bearer token is `UNAUTHENTICATED` without any call. The review's I/O is
the caller's (`post`: the controller's aiohttp client, the agent's urllib one in a thread);
this module holds the decisions.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from deathwatch._kube.errors import KubeError, describe

TOKEN_REVIEWS: Final = "/apis/authentication.k8s.io/v1/tokenreviews"  # noqa: S105 - a path
ACCESS_REVIEWS: Final = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

Post = Callable[[str, Mapping[str, Any]], Awaitable[Mapping[str, Any]]]


class Grant(enum.Enum):
    ALLOWED = 200
    UNAUTHENTICATED = 401
    FORBIDDEN = 403
    BUSY = 503  # the review budget is spent: try again
    UNAVAILABLE = 504  # the API server did not answer the review

    @property
    def status(self) -> int:
        """The HTTP status to answer with."""
        return 503 if self in (Grant.BUSY, Grant.UNAVAILABLE) else self.value


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer ...` header, if that is what it holds."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def token_review(token: str) -> dict[str, Any]:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token}}  # fmt: skip


def access_review(user: Mapping[str, Any], path: str, verb: str = "get") -> dict[str, Any]:
    """A SubjectAccessReview of `verb` on the non-resource URL `path`, for the user a
    TokenReview named (name, uid, groups, extra, as the API server said them)."""
    spec: dict[str, Any] = {
        "user": user.get("username") or "",
        "groups": list(user.get("groups") or []),
        "nonResourceAttributes": {"path": path, "verb": verb},
    }
    if user.get("uid"):
        spec["uid"] = user["uid"]
    if user.get("extra"):
        spec["extra"] = dict(user["extra"])
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": spec}  # fmt: skip


def authenticated(review: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The user a TokenReview's answer names, or None when the token was not accepted."""
    status = review.get("status") or {}
    if status.get("authenticated") is not True:
        return None
    user: Mapping[str, Any] = status.get("user") or {}
    return user


def allowed(review: Mapping[str, Any]) -> bool:
    status = review.get("status") or {}
    return status.get("allowed") is True and status.get("denied") is not True


class Access:
    """The decisions for one process's endpoints. `post(path, body)` makes one API call
    (within its own deadline) and returns the answer, raising errors.KubeError for the API's
    and the network's failures."""

    def __init__(
        self,
        post: Post,
        *,
        verb: str = "get",
        allowed_for: float = 300.0,
        refused_for: float = 30.0,
        entries: int = 4096,
        concurrent: int = 2,
        per_second: float = 5.0,
        burst: int = 10,
        readers: int = 64,
        renewals: float = 1.0,
        stale_for: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.post, self.verb, self.clock = post, verb, clock
        self.allowed_for, self.refused_for, self.entries = allowed_for, refused_for, entries
        self._cache: OrderedDict[tuple[bytes, str], tuple[Grant, float]] = OrderedDict()
        self._pending: dict[tuple[bytes, str], asyncio.Future[Grant]] = {}
        self._shared = _Budget(concurrent, per_second, burst, clock)
        self._renewals = _Budget(1, renewals, max(1, int(renewals * 4)), clock)
        # known readers: when each was last allowed by a review
        self._readers: OrderedDict[tuple[bytes, str], float] = OrderedDict()
        self.readers, self.stale_for = readers, stale_for
        self._renewing: set[asyncio.Task[None]] = set()
        self.decisions: Counter[str] = Counter()  # by outcome, and `reviewed` per review made
        self.last_failure: str | None = None  # the last review the API did not answer, said

    async def check(self, authorization: str | None, path: str) -> Grant:
        """May the bearer of this Authorization header `verb` the URL `path`?"""
        decision = await self._decide(authorization, path)
        self.decisions[decision.name.lower()] += 1
        return decision

    async def _decide(self, authorization: str | None, path: str) -> Grant:
        token = bearer(authorization)
        if token is None:
            return Grant.UNAUTHENTICATED
        key = (hashlib.sha256(token.encode()).digest(), path)
        cached = self._cache.get(key)
        if cached is not None:
            decision, until = cached
            if self.clock() < until:
                self._cache.move_to_end(key)
                return decision
            del self._cache[key]
        allowed_at = self._readers.get(key)
        if allowed_at is not None and self.clock() < allowed_at + self.allowed_for + self.stale_for:
            self._renew(token, key, path)
            self.decisions["stale"] += 1
            return Grant.ALLOWED
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        budget = self._shared
        if not budget.spend():
            return Grant.BUSY
        future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            decision = await self._review(token, path)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters get it, nobody is warned of it
            raise
        finally:
            budget.done()
            del self._pending[key]
        if decision is not Grant.UNAVAILABLE:
            self._remember(key, decision)
        future.set_result(decision)
        return decision

    async def settled(self) -> None:
        """Wait for the renewals under way (tests, and a port closing)."""
        while self._renewing:
            await asyncio.gather(*self._renewing, return_exceptions=True)

    def _renew(self, token: str, key: tuple[bytes, str], path: str) -> None:
        """Review a known reader again in the background, one at a time, from its budget."""
        if key in self._pending or not self._renewals.spend():
            return
        future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        self._pending[key] = future

        async def renew() -> None:
            decision = Grant.UNAVAILABLE
            try:
                decision = await self._review(token, path)
            except Exception as exc:  # a bug: counted and said (/readyz), the allowance kept
                self.decisions["error"] += 1
                self.last_failure = f"renewal: {type(exc).__name__}: {exc}"
            finally:  # cancelled too: whoever waits on it is answered
                self._renewals.done()
                del self._pending[key]
                if decision is not Grant.UNAVAILABLE:
                    self._remember(key, decision)
                future.set_result(decision)

        task = asyncio.get_running_loop().create_task(renew())
        self._renewing.add(task)
        task.add_done_callback(self._renewing.discard)

    async def _review(self, token: str, path: str) -> Grant:
        self.decisions["reviewed"] += 1
        try:
            user = authenticated(await self.post(TOKEN_REVIEWS, token_review(token)))
            if user is None:
                return Grant.UNAUTHENTICATED
            answer = await self.post(ACCESS_REVIEWS, access_review(user, path, self.verb))
        except KubeError as exc:
            self.last_failure = describe(exc)
            return Grant.UNAVAILABLE
        return Grant.ALLOWED if allowed(answer) else Grant.FORBIDDEN

    def _remember(self, key: tuple[bytes, str], decision: Grant) -> None:
        ttl = self.allowed_for if decision is Grant.ALLOWED else self.refused_for
        self._cache[key] = (decision, self.clock() + ttl)
        self._cache.move_to_end(key)
        while len(self._cache) > self.entries:
            self._cache.popitem(last=False)
        if decision is Grant.ALLOWED:
            self._readers[key] = self.clock()
            self._readers.move_to_end(key)
            while len(self._readers) > self.readers:
                self._readers.popitem(last=False)
        else:
            self._readers.pop(key, None)  # refused now (revoked): no longer a known reader


class _Budget:
    """Reviews: at most `concurrent` in flight, `per_second` on average, bursts of `burst`."""

    def __init__(
        self, concurrent: int, per_second: float, burst: int, clock: Callable[[], float]
    ) -> None:
        self.concurrent, self.per_second, self.burst, self.clock = (
            concurrent,
            per_second,
            burst,
            clock,
        )
        self.in_flight = 0
        self.tokens = float(burst)
        self.filled = clock()

    def spend(self) -> bool:
        """One review from the budget, if it has one."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.filled) * self.per_second)
        self.filled = now
        if self.in_flight >= self.concurrent or self.tokens < 1:
            return False
        self.tokens -= 1
        self.in_flight += 1
        return True

    def done(self) -> None:
        self.in_flight -= 1
