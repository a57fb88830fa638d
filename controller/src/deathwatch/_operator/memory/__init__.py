"""What the controller knows, kept in one place per concept: the Core (every input's
shared state; the tail each pass ends in is passes/tail.py), one record per sandbox
(`records`), the DeathWatches compiled (`deathwatches`), agent-sandbox's Sandboxes
(`agent_sandboxes`) and the firewall agents' coverage as last read (`coverage`)."""
