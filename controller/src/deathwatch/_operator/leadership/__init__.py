"""Who may write: one answer (`group.Leadership`) every part that writes asks and follows,
and the Lease that decides it, elected and fenced (`leader.Elector`)."""
