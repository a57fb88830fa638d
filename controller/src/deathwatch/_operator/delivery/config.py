"""Where verdicts are delivered: the sinks file the controller mounts (the chart's
`delivery.sinks`, a ConfigMap), and each sink's signing keys and CA (its Secret, mounted).

    cluster: prod-eu-1                  # in every event's source: //deathwatch.dev/clusters/...
    sinks:
      - name: billing                   # a DNS label: in metrics, marks and the keys' path
        url: https://billing.internal/hooks/deathwatch
        secretDir: /etc/deathwatch/delivery/billing  # keys (whsec_..., one a line), ca.crt
        states: [Dead]                  # what it is sent: any of Alive, Suspect, Dead, Gone
        mode: structured                # CloudEvents HTTP mode: structured, or binary
        namespaces: []                  # only these namespaces' verdicts (empty: all)
        timeoutSeconds: 30              # each attempt's deadline (at most 30)
        concurrency: 8                  # attempts in flight at once, at most
        maxAgeSeconds: 86400            # owed longer than this: given up (Expired, counted)
        lateAfterSeconds: 5             # owed longer than this: the DeathWatch's Delivered
                                        # condition turns False (Backlog), within a second
        allowInsecure: false            # true: http:// is allowed (in-cluster receivers)

Only whoever may write the controller's ConfigMap declares a sink (ADR 0024): tenants, who
may read verdicts and DeathWatches, cannot aim the controller's requests anywhere. Parsed
strictly, as the firewall's config: an unknown key, a wrong type or a bad value is one line
naming the field and the value.
"""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import yaml

from deathwatch._api.resources import DNS_LABEL
from deathwatch._engine.verdict import State
from deathwatch._kube.configfile import ConfigError, explain

MAX_TIMEOUT = 30.0  # the field notes' cap on every call
KEY_PREFIX = "whsec_"
# a transition owed longer than this makes the Delivered condition False: a receiver that
# answers is told in milliseconds, so 5 s is a sink falling behind, said within 10 s (#43)
LATE_AFTER = 5.0
SENDABLE = (State.ALIVE, State.SUSPECT, State.DEAD, State.GONE)


class _Sink(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True, kw_only=True):
    name: Annotated[str, msgspec.Meta(pattern=DNS_LABEL, max_length=63)]
    url: str
    secret_dir: str
    states: list[Literal["Alive", "Suspect", "Dead", "Gone"]] = msgspec.field(
        default_factory=lambda: ["Dead"]
    )
    mode: Literal["structured", "binary"] = "structured"
    namespaces: list[Annotated[str, msgspec.Meta(pattern=DNS_LABEL, max_length=63)]] = []
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=MAX_TIMEOUT)] = MAX_TIMEOUT
    concurrency: Annotated[int, msgspec.Meta(ge=1, le=64)] = 8
    max_age_seconds: Annotated[int, msgspec.Meta(ge=60)] = 86_400
    late_after_seconds: Annotated[float, msgspec.Meta(ge=1, le=3600)] = LATE_AFTER
    allow_insecure: bool = False


class _File(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True):
    cluster: Annotated[str, msgspec.Meta(pattern=DNS_LABEL, max_length=63)]
    sinks: Annotated[list[_Sink], msgspec.Meta(max_length=16)] = []


@dataclass(frozen=True)
class Sink:
    name: str
    url: str
    secret_dir: Path
    states: frozenset[State]
    mode: str
    namespaces: frozenset[str]
    timeout: float
    concurrency: int
    max_age: float
    late_after: float = LATE_AFTER

    def wants(self, namespace: str, state: State) -> bool:
        return state in self.states and (not self.namespaces or namespace in self.namespaces)


@dataclass(frozen=True)
class DeliveryConfig:
    cluster: str
    sinks: tuple[Sink, ...]


def parse(data: object, source: str = "delivery config") -> DeliveryConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with cluster and sinks, got "
                          f"{type(data).__name__}")  # fmt: skip
    try:
        raw = msgspec.convert(data, _File)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {explain(exc, data, _EXPECTED)}") from None
    sinks, seen = [], set()
    for i, s in enumerate(raw.sinks):
        where = f"{source}: sinks[{i}]"
        if s.name in seen:
            raise ConfigError(f"{where}.name: {s.name!r} is given twice")
        seen.add(s.name)
        _check_url(s.url, s.allow_insecure, f"{where}.url")
        sinks.append(Sink(
            name=s.name, url=s.url, secret_dir=Path(s.secret_dir),
            states=frozenset(State(x) for x in s.states), mode=s.mode,
            namespaces=frozenset(s.namespaces), timeout=s.timeout_seconds,
            concurrency=s.concurrency, max_age=float(s.max_age_seconds),
            late_after=s.late_after_seconds,
        ))  # fmt: skip
    return DeliveryConfig(raw.cluster, tuple(sinks))


def load(path: str | Path) -> DeliveryConfig:
    """Read and validate the sinks file. Raises ConfigError (never anything else)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {str(exc).splitlines()[0]}") from None
    return parse(data, str(p))


def _check_url(url: str, insecure: bool, where: str) -> None:
    try:
        u = urllib.parse.urlsplit(url)
        u.port  # noqa: B018 - a port that is not a number raises here
    except ValueError as exc:
        raise ConfigError(f"{where}: {url!r}: {exc}") from None
    if u.scheme not in ("https", "http") or not u.hostname:
        raise ConfigError(f"{where}: expected an https:// URL with a host, got {url!r}")
    if u.scheme == "http" and not insecure:
        raise ConfigError(f"{where}: {url!r} is plain http: use https, or allowInsecure: true "
                          "for a receiver inside the cluster")  # fmt: skip
    if u.username is not None or u.password is not None:
        raise ConfigError(f"{where}: {url!r} carries credentials: the signature authenticates "
                          "the controller, put none in the URL")  # fmt: skip
    if u.fragment:
        raise ConfigError(f"{where}: {url!r}: a fragment is never sent")


_EXPECTED = {
    "cluster": "a DNS label (the cluster's name in every event's source)",
    "sinks": "a list of at most 16 sinks",
    "sinks[].name": "a DNS label of at most 63 characters",
    "sinks[].url": "an https:// URL",
    "sinks[].secretDir": "the directory the sink's Secret is mounted at",
    "sinks[].states": "a list of Alive, Suspect, Dead, Gone",
    "sinks[].states[]": "one of Alive, Suspect, Dead, Gone",
    "sinks[].namespaces[]": "a namespace's name",
    "sinks[].mode": "structured or binary",
    "sinks[].namespaces": "a list of namespace names",
    "sinks[].timeoutSeconds": f"seconds, above 0 and at most {MAX_TIMEOUT:.0f}",
    "sinks[].concurrency": "1 to 64",
    "sinks[].maxAgeSeconds": "seconds, at least 60",
    "sinks[].lateAfterSeconds": "seconds, 1 to 3600",
    "sinks[].allowInsecure": "true or false",
}


def keys(sink: Sink) -> tuple[bytes, ...]:
    """The sink's signing keys (its Secret's `keys`: one `whsec_` key a line; two while one
    rotates). Read at each use: the kubelet updates a mounted Secret in place."""
    path = sink.secret_dir / "keys"
    try:
        lines = [x.strip() for x in path.read_text().splitlines() if x.strip()]
    except OSError as exc:
        raise ConfigError(f"sink {sink.name}: {path}: cannot read: {exc.strerror or exc}") from None
    found = []
    for n, line in enumerate(lines, 1):
        if not line.startswith(KEY_PREFIX):
            raise ConfigError(f"sink {sink.name}: {path} line {n}: expected a key starting with "
                              f"{KEY_PREFIX!r}")  # fmt: skip
        try:
            key = base64.b64decode(line[len(KEY_PREFIX) :] + "==", validate=False)
        except (binascii.Error, ValueError):
            raise ConfigError(f"sink {sink.name}: {path} line {n}: not base64") from None
        if len(key) < 24:
            raise ConfigError(f"sink {sink.name}: {path} line {n}: a key of {len(key)} bytes; "
                              "at least 24 (Standard Webhooks: 24 to 64)")  # fmt: skip
        found.append(key)
    if not found:
        raise ConfigError(f"sink {sink.name}: {path}: no key")
    if len(found) > 4:
        raise ConfigError(f"sink {sink.name}: {path}: {len(found)} keys; at most 4")
    return tuple(found)


def ca_file(sink: Sink) -> Path | None:
    """The sink's private CA (`ca.crt` in its Secret), if it has one."""
    path = sink.secret_dir / "ca.crt"
    return path if path.is_file() else None
