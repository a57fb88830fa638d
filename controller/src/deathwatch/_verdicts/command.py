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
from typing import TextIO

from deathwatch._verdicts.asking import EXITS, FOR, duration


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
