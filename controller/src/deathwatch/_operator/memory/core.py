"""The controller's memory, in one place (as kopf keeps one ResourceMemories): one record per
sandbox, the DeathWatches compiled, agent-sandbox's Sandboxes, the counts, the engine's
Suspect deadlines, the firewall as last read, this shard's filter. Nothing here judges,
writes or sends: each pass is handed the parts it uses (passes/wiring.py), and every pass
ends in the tail (passes/tail.py). All calls run on the event loop; nothing blocks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from deathwatch._engine.memory import Deadlines
from deathwatch._operator.leadership.rivals import Rivals
from deathwatch._operator.memory.agent_sandboxes import AgentSandboxes
from deathwatch._operator.memory.coverage import Coverage
from deathwatch._operator.memory.deathwatches import DeathWatches
from deathwatch._operator.memory.records import Records
from deathwatch._operator.reporting.deathwatch_status import FirewallReading
from deathwatch._operator.reporting.summary import Summaries
from deathwatch._operator.shards.filter import ShardFilter


class Firewall:
    """What the controller knows of the firewall: the DaemonSet as the probe loop last read
    it (for the DeathWatch status), and the agents' coverage (each verdict's Shielded; None
    when no firewall is configured)."""

    def __init__(self, daemonset: str | None, coverage: Coverage | None) -> None:
        self.reading = FirewallReading(daemonset)
        self.coverage = coverage


@dataclass
class Core:
    """What the controller knows."""

    deathwatches: DeathWatches
    records: Records = field(default_factory=Records)
    agent_sandboxes: AgentSandboxes = field(default_factory=AgentSandboxes)  # as watched
    summaries: Summaries = field(default_factory=Summaries)  # each DeathWatch's counts
    deadlines: Deadlines = field(default_factory=Deadlines)  # Suspect windows, by closing
    firewall: Firewall = field(default_factory=lambda: Firewall(None, None))
    shards: ShardFilter = field(default_factory=ShardFilter)
    # other releases sharing what this one holds, as last read (None: not checked)
    rivals: Rivals | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # a new Suspect deadline

    @property
    def coverage(self) -> Coverage | None:
        """The agents' coverage (None: no firewall configured, no Shielded)."""
        return self.firewall.coverage
