"""The Kubernetes API as deathwatch speaks it: below every user of the API in this
distribution (the controller, `deathwatch.client`, `preflight`, `wait`/`explain`), above the
engine. None of them imports the controller for it.

- `rest`: the API's calls (aiohttp), each with a deadline; `kubeconfig`: credentials, as
  kubectl finds them;
- `resources`: deathwatch's CRDs as types (DeathWatch spec, SandboxVerdict status, conditions,
  reasons, labels) and their paths; `rules`: a DeathWatch compiled for judging;
- `objects`: the objects of the watches, decoded once from their bytes, and what a watch says
  of them; `agent_sandbox`: agent-sandbox's API as deathwatch reads it;
- `verdict_document`: a SandboxVerdict read back (for clients, delivery and `explain`).

The formats a node agent shares with the controller (the coverage and exits Leases) are in
`deathwatch._kube`, the distribution both import.
"""
