"""The controller, a folder per concept, each layer importing only the ones below it
(checked by import-linter: .importlinter; docs/architecture.md draws the same):

    process      the process: arguments, wiring, the timed loops (app, command, timers)
    sources      what comes in: reflectors, decoders, receivers, adoption, periodic reads, exits
    passes       one per input: a class whose fields are what it uses, judging it on the
                 memory; the tail every pass ends in
    memory       what the controller knows: the Core, records, DeathWatches, Sandboxes, coverage
    writing      what goes out: the writer (one write in flight per object, fenced) and its calls
    reporting    pure: what a step means (decisions), the documents that say it, the counts,
                 Shielded; the engine judges, this says what it judged
    delivery     CloudEvents to the platform's sinks, at least once
    shards       which slots this process judges, claimed on Leases
    ports        /healthz, /readyz, /metrics
    leadership   who may write: the Lease, elected
    instruments  what every part reports to: metrics, supervised tasks, GC pauses

The engine (`deathwatch._engine`, pure) and the API layer (`deathwatch._api`) are below it all.
"""
