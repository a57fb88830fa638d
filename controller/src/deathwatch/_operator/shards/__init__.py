"""Sharding (ADR 0025): the 64 slots and their ranges (`slots`), a shard's claim on them
(`slot_claims`), the per-slot Leases (`slot_leases`) and what this process judges
(`filter`)."""
