"""What every part of the controller reports to: its metrics (`metrics`), the supervisor of
its long-running tasks and one-shot work (`supervisor`: restarted with backoff, counted,
logged), and the garbage collector's pauses (`gcpauses`)."""
