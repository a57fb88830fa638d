"""The controller, a folder per concept, each layer importing only the ones below it
(checked by import-linter: .importlinter; docs/architecture.md draws the same):

    process      the process: arguments, wiring, the timed loops (app, command, timers)
    sources      what comes in: reflectors, decoders, sinks, adoption, periodic reads, exits
    passes       one per input: free functions that judge it on the memory and settle it
    memory       what the controller knows: the Core, records, DeathWatches, Sandboxes, coverage
    writing      what goes out: the writer (one write in flight per object, fenced) and its calls
    delivery     CloudEvents to the platform's sinks, at least once
    judging      pure decisions and the documents: what a step means, what a verdict says, Shielded
    shards       which slots this process judges, claimed on Leases
    leadership   who may write: the Lease, elected
    ports        /healthz, /readyz, /metrics
    instruments  what every part reports to: metrics, supervised tasks, GC pauses

The engine (`deathwatch._engine`, pure) and the API layer (`deathwatch._api`) are below it all.
"""
