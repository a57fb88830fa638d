"""How a metric is declared: on a class body, built per instance in that instance's registry
(so tests read each controller's metrics in isolation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass(frozen=True)
class Declared:
    """A metric as declared on a class: built per instance, in that instance's registry."""

    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str
    documentation: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None

    def build(self, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
        if self.kind is Histogram:
            return Histogram(self.name, self.documentation, self.labels, registry=registry,
                             buckets=self.buckets or Histogram.DEFAULT_BUCKETS)  # fmt: skip
        return self.kind(self.name, self.documentation, self.labels, registry=registry)


def counter(name: str, documentation: str, *, labels: tuple[str, ...] = ()) -> Any:
    """A Counter declared on a class body (built per instance: `build`)."""
    return Declared(Counter, name, documentation, labels)


def gauge(name: str, documentation: str, *, labels: tuple[str, ...] = ()) -> Any:
    """A Gauge declared on a class body (built per instance: `build`)."""
    return Declared(Gauge, name, documentation, labels)


def histogram(name: str, documentation: str, *, labels: tuple[str, ...] = (),
              buckets: tuple[float, ...] = Histogram.DEFAULT_BUCKETS) -> Any:  # fmt: skip
    """A Histogram declared on a class body (built per instance: `build`)."""
    return Declared(Histogram, name, documentation, labels, tuple(buckets))


def build(owner: object, registry: CollectorRegistry) -> None:
    """Every metric declared on `owner`'s class and its bases, built in `registry`, as its
    attribute."""
    for klass in reversed(type(owner).__mro__):
        for attr, declared in vars(klass).items():
            if isinstance(declared, Declared):
                setattr(owner, attr, declared.build(registry))
