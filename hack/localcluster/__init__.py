"""Local clusters for tests, the demo and people: a control plane (and later a node)."""
