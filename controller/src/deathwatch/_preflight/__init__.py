"""`deathwatch preflight`: a cluster read before install (checks.py pure, reads.py I/O)."""
