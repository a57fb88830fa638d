"""The agent's own measurement of its output rule: a claim turned into an observation.

A table that matches the config says the rule is written, not that packets meet it. Once a
resync, the agent connects from the host's network namespace (its own: hostNetwork) to the
agent port of one of this node's sandboxes, as any host process could, and reads the output
chain's packet counter before and after:

- `verified`: refused with a reset, and our counter rose: the host's connection met our
  rule and was refused by it;
- `bypassed`: the connection was accepted. Whatever lies between the host and the sandbox
  skips the table (an eBPF datapath that redirects host traffic, the table in another
  network namespace than the host's): no verdict may call that sandbox shielded;
- `inconclusive`: refused without our counter moving (someone else's rule refused it
  first), or no answer in time (someone drops it): neither proves nor disproves ours;
- `none`: no sandbox of this node to try (none runs here, or the inbound rule is off and
  none is listed).

In audit mode (ruleset.py) nothing is refused: the connection carries the agent's mark
(`SO_MARK`, which CAP_NET_ADMIN allows), which the output chain counts on a rule of its own
(so it is never counted or recorded as a host's connection that would be refused), and
`verified` is that rule's counter rising; `bypassed` is the connection made without it.

The connection sends nothing and is closed at once; when bypassed (or audited), the sandbox's
agent saw one connection open and close with no byte. What it does not measure: the inbound rule
(packets from another host, which the agent cannot send from its node) (ADR 0023).
`outcome` is pure; `measure` is the one connection.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from enum import StrEnum

from deathwatch.firewall.ruleset import CHAIN, SELF_COMMENT, SELF_MARK, Address
from deathwatch.firewall.table import Table

TIMEOUT = 1.0  # a reset from the local rule comes in well under a millisecond


class Measured(StrEnum):
    VERIFIED = "verified"
    BYPASSED = "bypassed"
    INCONCLUSIVE = "inconclusive"
    NONE = "none"


def output_packets(table: Table | None, audit: bool = False) -> int:
    """What the output chain's rules have refused so far; in audit mode, what its self-check
    rule has counted of the agent's own connections."""
    if table is None:
        return 0
    return sum(r.packets for c in table.chains if c.name == CHAIN for r in c.rules
               if not audit or r.comment == SELF_COMMENT)  # fmt: skip


def outcome(connected: str, before: int, after: int, audit: bool = False) -> Measured:
    """`connected`: connected, refused or timeout; the counters around the attempt."""
    if audit:  # nothing is refused: our rule saw it, or the host's path skips the table
        if after > before:
            return Measured.VERIFIED
        return Measured.BYPASSED if connected == "connected" else Measured.INCONCLUSIVE
    if connected == "connected":
        return Measured.BYPASSED
    if connected == "refused" and after > before:
        return Measured.VERIFIED
    return Measured.INCONCLUSIVE


def connect(address: Address, port: int, timeout: float = TIMEOUT, mark: bool = False) -> str:
    """`mark`: carry the self-check's mark (audit mode)."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            if mark:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, SELF_MARK)
        except OSError as exc:  # no CAP_NET_ADMIN: it would count as a host's connection
            return f"error:mark:{exc.errno}"
        try:
            s.connect((str(address), port))
        except ConnectionRefusedError:
            return "refused"
        except TimeoutError:
            return "timeout"
        except OSError as exc:  # unreachable, no route: no answer from the sandbox either
            return f"error:{exc.errno}"
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        return "connected"


def measure(
    read: Callable[[], Table | None],
    address: Address,
    port: int,
    dial: Callable[[Address, int], str] | None = None,
    audit: bool = False,
) -> tuple[Measured, str]:
    """One attempt at `address`:`port` (`dial`: `connect` unless given), between two reads of
    the table's counters; what it means and what the connection did."""
    before = output_packets(read(), audit)
    if dial is not None:
        did = dial(address, port)
    else:
        did = connect(address, port, mark=True) if audit else connect(address, port)
    return outcome(did, before, output_packets(read(), audit), audit), did
