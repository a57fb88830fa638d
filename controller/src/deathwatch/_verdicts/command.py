"""`deathwatch wait` and `deathwatch explain` (also `kubectl deathwatch ...`): their arguments.

Exit codes (`EXITS`, said in --help): 0 the verdict reached a state asked for (explain: shown);
1 it timed out or can no longer (a Gone pod can never be Dead; explain: no verdict); 2 bad
input; 3 the API server cannot be reached; 4 the kubeconfig cannot be used; 5 the credentials
cannot be had or are not accepted (401); 6 the API server refused (403, deathwatch's CRDs not
installed, any other status). Always one line on stderr naming the file, context, address or
object, never a traceback. The work is act.py's, imported only when a command runs: the API client
(aiohttp, the kubernetes configuration loader) costs half a second to import, and `deathwatch
replay` and `--help` must not pay it.
"""

from __future__ import annotations

import argparse
import re
from typing import TextIO

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


def _target(args: argparse.Namespace, default_namespace: str = "default") -> tuple[str, str]:
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


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("target", metavar="NS/POD", nargs="?",
                        help="the sandbox pod (or POD with -n)")  # fmt: skip
    common.add_argument("--sandbox", metavar="NAME", default=None,
                        help="an agent-sandbox Sandbox: its current pod's verdict")  # fmt: skip
    common.add_argument("-n", "--namespace", default=None,
                        help="when not in NS/POD (default: the context's namespace)")  # fmt: skip
    common.add_argument("--kubeconfig", default=None, help="else in-cluster, $KUBECONFIG, ~/.kube")
    common.add_argument("--context", default=None, help="a kubeconfig context, not the current")
    w = subparsers.add_parser(
        "wait",
        parents=[common],
        help="wait until a pod's verdict reaches a state",
        description=EXITS,
    )
    w.add_argument("--for", dest="wanted", required=True, choices=sorted(FOR),
                   help="ended: Dead or Gone")  # fmt: skip
    w.add_argument("--timeout", type=duration, default=duration("30s"), help="default 30s")
    w.set_defaults(run=run_wait)
    e = subparsers.add_parser(
        "explain",
        parents=[common],
        help="a pod's verdict: cause, evidence, timeline, policy, shield and Events",
        description=EXITS.replace("when reached", "when shown").replace(
            "when timed out or no longer reachable (a Gone pod can never be Dead)",
            "when there is no verdict (the message says whether the pod exists)",
        ),
    )
    e.add_argument("-o", "--output", choices=("text", "json"), default="text")
    e.set_defaults(run=run_explain)


def run_wait(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from deathwatch._verdicts import act

    return act.wait(args, out, err)


def run_explain(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    from deathwatch._verdicts import act

    return act.explain(args, out, err)
