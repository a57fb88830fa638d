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

The connection sends nothing and is closed at once; when bypassed, the sandbox's agent saw
one connection open and close with no byte. What it does not measure: the inbound rule
(packets from another host, which the agent cannot send from its node) (ADR 0023).
`outcome` is pure; `measure` is the one connection.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from enum import StrEnum

from deathwatch.firewall.ruleset import CHAIN, Address
from deathwatch.firewall.table import Table

TIMEOUT = 1.0  # a reset from the local rule comes in well under a millisecond


class Measured(StrEnum):
    VERIFIED = "verified"
    BYPASSED = "bypassed"
    INCONCLUSIVE = "inconclusive"
    NONE = "none"


def output_packets(table: Table | None) -> int:
    """What the output chain's rules have refused so far."""
    if table is None:
        return 0
    return sum(r.packets for c in table.chains if c.name == CHAIN for r in c.rules)


def outcome(connected: str, before: int, after: int) -> Measured:
    """`connected`: connected, refused or timeout; the counters around the attempt."""
    if connected == "connected":
        return Measured.BYPASSED
    if connected == "refused" and after > before:
        return Measured.VERIFIED
    return Measured.INCONCLUSIVE


def connect(address: Address, port: int, timeout: float = TIMEOUT) -> str:
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
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
) -> tuple[Measured, str]:
    """One attempt at `address`:`port` (`dial`: `connect` unless given), between two reads of
    the table's counters; what it means and what the connection did."""
    before = output_packets(read())
    did = (dial or connect)(address, port)
    return outcome(did, before, output_packets(read())), did
