"""The kopf operator: watches sandbox pods, feeds the engine, publishes SandboxVerdicts and
DeathWatch status. Never writes to sandbox pods."""
