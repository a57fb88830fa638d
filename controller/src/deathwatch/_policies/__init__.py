"""Death policies: what a Ready drop means for a pod, pluggable through entry points."""

from deathwatch._policies.base import ContainerDeath, Decision, Policy, PolicySettings, Situation
from deathwatch._policies.registry import (
    AUTO,
    ENTRY_POINT_GROUP,
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
