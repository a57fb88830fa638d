"""What `deathwatch wait` and `explain` ask for, shared by their arguments (command.py) and
their work (act.py): the pod or Sandbox named (`target`), the states a wait is for (`FOR`), a
timeout (`duration`) and the exit codes (`EXITS`)."""

from __future__ import annotations

import argparse
import re

from deathwatch._engine.verdict import State

EXIT_OK, EXIT_NOT_REACHED, EXIT_BAD_INPUT = 0, 1, 2
EXITS = (
    "Exit 0 when reached, 1 when timed out or no longer reachable (a Gone pod can never be "
    "Dead), 2 on bad input, 3 when the API server cannot be reached, 4 when the kubeconfig "
    "cannot be used, 5 when the credentials cannot be had or are refused (401), 6 when the API "
    "server refuses (403, deathwatch's CRDs not installed)."
)
FOR: dict[str, frozenset[State]] = {
    **{s.value.lower(): frozenset({s}) for s in State},
    "ended": frozenset({State.DEAD, State.GONE}),
}
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def duration(text: str) -> float:
    """ "60s", "2m", "1h30m", "90" (seconds)."""
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None:
        raise argparse.ArgumentTypeError(f"--timeout {text!r}: not a duration like 60s, 2m or 1h")
    h, m, s = (float(g) if g else 0.0 for g in match.groups())
    seconds = h * 3600 + m * 60 + s
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"--timeout {text!r}: must be more than 0")
    return seconds


def target(args: argparse.Namespace, default_namespace: str = "default") -> tuple[str, str]:
    """NS/POD, or POD with -n NS, or --sandbox NAME with -n NS (else the kubeconfig context's
    namespace, as kubectl); the names checked so a typo is one line, not a 404."""
    if (args.target is None) == (args.sandbox is None):
        raise ValueError("name one pod (NS/POD) or one agent-sandbox Sandbox (--sandbox NAME)")
    namespace, _, pod = (args.target or args.sandbox).rpartition("/")
    namespace = namespace or args.namespace or default_namespace
    what_pod = "sandbox" if args.sandbox else "pod"
    for what, value in (("namespace", namespace), (what_pod, pod)):
        if not _NAME.match(value) or len(value) > 253:
            raise ValueError(f"{what} {value!r} is not a Kubernetes name (NS/POD or -n NS POD)")
    return namespace, pod
