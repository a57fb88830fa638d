"""Pure judgements over plain data: what an engine step means for the outside world
(`decisions`), every document the controller writes (`sandbox_verdicts`, `deathwatch_status`,
`pod_events`; the `conditions` and `wording` they share), a DeathWatch's counts kept
by difference (`summary`), and whether a sandbox is Shielded (`shield`). No I/O, no clock."""
