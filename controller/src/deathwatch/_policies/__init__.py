"""Death policies: what a Ready drop means for a pod, pluggable through entry points."""

from deathwatch._engine.contract import (
    ENTRY_POINT_GROUP,
    ContainerDeath,
    Decision,
    Policy,
    PolicySettings,
    Situation,
)
from deathwatch._policies.registry import (
    AUTO,
    PolicyRegistry,
    UnknownPolicy,
    default_registry,
)

__all__ = [
    "AUTO",
    "ENTRY_POINT_GROUP",
    "ContainerDeath",
    "Decision",
    "Policy",
    "PolicyRegistry",
    "PolicySettings",
    "Situation",
    "UnknownPolicy",
    "default_registry",
]
