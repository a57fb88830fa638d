"""Who may write: the leader's Lease, elected and fenced (`leader`)."""
