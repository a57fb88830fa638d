"""The table `inet deathwatch` as one typed model, and its two renderings. Pure functions.

`Table` is what the agent owns: sets and base chains with their rules. The same model is
rendered as the nft script that replaces the whole table in one transaction (`script`), and
is what `nft -j list table` reduces to (`from_json`), so "is the live table what we want"
is a comparison of two values (`differences`). Match operands are kept in nft's own syntax
("ip daddr", "@pod_v4", "{ 8000, 49983 }"), the form both sides can be reduced to.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

FAMILY, NAME = "inet", "deathwatch"  # NAME: the default table; each release names its own
# an nft table's name as a release may choose it (a letter, then letters, digits, - _ .)
TABLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,62}")


@dataclass(frozen=True)
class Set:
    name: str
    type: str  # ipv4_addr, ipv6_addr, inet_service; a concatenation as "ipv4_addr . inet_service"
    flags: tuple[str, ...] = ()
    # networks as CIDRs (interval sets), addresses (hash sets), ports as numbers; sorted as text
    # (a concatenation's element as "10.0.0.1 . 49983 . 10.1.0.5")
    elements: tuple[str, ...] = ()
    size: int = 0  # at most this many elements (0: nft's default)
    timeout: int = 0  # seconds an element added by a rule lives (0: for ever)
    # filled by the packet path (a rule's `update @set`), never by us: its elements are read,
    # never compared (what the audit mode records: ruleset.py)
    dynamic: bool = False


@dataclass(frozen=True)
class Match:
    left: str  # "ip daddr", "tcp dport", "fib saddr type"
    right: str  # "@pod_v4", "{ 49983 }", "local"
    op: str = "=="


@dataclass(frozen=True)
class Rule:
    matches: tuple[Match, ...]
    verdict: str  # "reject with tcp reset", "accept"; "": none, the packet goes on
    counter: bool = True
    comment: str | None = None
    # what the kernel counted so far: read back, never compared, never rendered
    packets: int = field(default=0, compare=False)
    # statements between the counter and the verdict, in nft's syntax:
    # "update @audit_v4 { ip saddr . tcp dport . ip daddr }"
    statements: tuple[str, ...] = ()


@dataclass(frozen=True)
class Chain:
    name: str
    type: str
    hook: str
    priority: int
    policy: str = "accept"
    rules: tuple[Rule, ...] = ()


@dataclass(frozen=True)
class Table:
    sets: tuple[Set, ...] = ()
    chains: tuple[Chain, ...] = ()
    name: str = NAME  # table inet NAME: a release's own (`--table`), so two never share one

    @property
    def rejected_packets(self) -> int:
        """What the rules that refuse counted (an audit rule refuses nothing)."""
        return sum(
            r.packets for c in self.chains for r in c.rules if r.verdict.startswith("reject")
        )


def interval(first: int, last: int, version: int) -> str:
    """An interval set's element as nft lists it: the prefix when [first, last] is exactly
    one, else `first-last`."""
    lo = ipaddress.ip_address(first) if version == 4 else ipaddress.IPv6Address(first)
    hi = ipaddress.ip_address(last) if version == 4 else ipaddress.IPv6Address(last)
    nets = list(ipaddress.summarize_address_range(lo, hi))
    return str(nets[0]) if len(nets) == 1 else f"{lo}-{hi}"


def ports(numbers: tuple[int, ...] | list[int]) -> str:
    """An anonymous set of ports in nft's syntax, in numeric order."""
    return "{ " + ", ".join(str(p) for p in sorted(numbers)) + " }"


# --- rendering: the script that replaces the table atomically ------------------------------


def _rule(rule: Rule) -> str:
    parts = [m.left + (f" {m.op} " if m.op != "==" else " ") + m.right for m in rule.matches]
    if rule.counter:
        parts.append("counter")
    parts.extend(rule.statements)
    if rule.verdict:
        parts.append(rule.verdict)
    if rule.comment is not None:
        parts.append(f"comment {json.dumps(rule.comment)}")
    return " ".join(parts)


def script(table: Table) -> str:
    """One `nft -f` transaction: declare, delete, define (works on nft 1.0.6), so there is
    no instant with a partial table or none."""
    name = table.name
    lines = [f"table {FAMILY} {name}", f"delete table {FAMILY} {name}", f"table {FAMILY} {name} {{"]
    for s in table.sets:
        size = f" size {s.size};" if s.size else ""
        flags = f" flags {', '.join(s.flags)};" if s.flags else ""
        timeout = f" timeout {s.timeout}s;" if s.timeout else ""
        elements = f" elements = {{ {', '.join(s.elements)} }}" if s.elements else ""
        lines.append(f"\tset {s.name} {{ type {s.type};{size}{flags}{timeout}{elements} }}")
    for c in table.chains:
        lines.append(f"\tchain {c.name} {{")
        lines.append(f"\t\ttype {c.type} hook {c.hook} priority {c.priority}; policy {c.policy};")
        lines.extend(f"\t\t{_rule(r)}" for r in c.rules)
        lines.append("\t}")
    lines.append("}")
    return "\n".join(lines) + "\n"


# --- reading `nft -j list table inet deathwatch` back ---------------------------------------


def _element(e: Any, ranged: bool = True) -> str:
    if isinstance(e, Mapping) and isinstance(e.get("elem"), Mapping):  # with its expiry
        return _element(e["elem"].get("val"), ranged)
    if isinstance(e, Mapping) and isinstance(e.get("concat"), list):
        return " . ".join(_element(part, ranged=False) for part in e["concat"])
    if isinstance(e, str):
        if not ranged:  # a hash set holds addresses, never prefixes
            return str(ipaddress.ip_address(e))
        return str(ipaddress.ip_network(e, strict=False))
    if isinstance(e, int):
        return str(e)
    if isinstance(e, Mapping) and "prefix" in e:
        p = e["prefix"]
        return str(ipaddress.ip_network(f"{p['addr']}/{p['len']}", strict=False))
    if isinstance(e, Mapping) and isinstance(e.get("range"), list) and len(e["range"]) == 2:
        lo, hi = (ipaddress.ip_address(x) for x in e["range"])
        return interval(int(lo), int(hi), lo.version)
    return json.dumps(e, sort_keys=True)  # anything else: kept, so it differs


def _left(x: Any) -> str:
    if isinstance(x, Mapping):
        if "payload" in x:
            return f"{x['payload'].get('protocol')} {x['payload'].get('field')}"
        if "meta" in x:
            return f"meta {x['meta'].get('key')}"
        if "fib" in x:
            return f"fib {' . '.join(x['fib'].get('flags', []))} {x['fib'].get('result')}"
        if "ct" in x:
            return f"ct {x['ct'].get('key')}"
    return json.dumps(x, sort_keys=True)


def _statement(e: Mapping[str, Any]) -> str | None:
    """A set update as we write it (`update @audit_v4 { ip saddr . tcp dport . ip daddr }`),
    None for anything else."""
    op = e.get("set")
    if not isinstance(op, Mapping) or op.get("op") not in ("add", "update"):
        return None
    elem = op.get("elem")
    concat = elem.get("concat") if isinstance(elem, Mapping) else None
    parts = concat if isinstance(concat, list) else [elem]
    return f"{op['op']} {op.get('set')} {{ {' . '.join(_left(p) for p in parts)} }}"


def _right(x: Any) -> str:
    if isinstance(x, Mapping) and "set" in x:
        items = x["set"]
        if all(isinstance(v, int) for v in items):
            return ports(items)
        return "{ " + ", ".join(_element(v) for v in items) + " }"
    if isinstance(x, int):
        return ports([x])  # a single port: the same as a set of one
    if isinstance(x, str):
        return x  # "@set", "local"
    return json.dumps(x, sort_keys=True)


def _reduce_rule(r: Mapping[str, Any]) -> Rule:
    matches: list[Match] = []
    counter, packets, verdict = False, 0, ""
    unknown: list[str] = []
    statements: list[str] = []
    for e in r.get("expr", []):
        if "match" in e:
            m = e["match"]
            op = m.get("op", "==")
            if op == "in" and isinstance(m.get("right"), str):
                op = "=="  # a flag matched (`ct state new`): written without the operator
            matches.append(Match(_left(m.get("left")), _right(m.get("right")), op))
        elif "set" in e and (said := _statement(e)) is not None:
            statements.append(said)
        elif "counter" in e:
            counter = True
            if isinstance(e["counter"], Mapping):
                packets = int(e["counter"].get("packets", 0))
        elif "reject" in e:
            kind = (e["reject"] or {}).get("type")
            verdict = f"reject with {kind}" if kind else "reject"
        elif len(e) == 1 and next(iter(e)) in ("accept", "drop", "return"):
            verdict = next(iter(e))
        else:
            unknown.append(json.dumps(e, sort_keys=True))
    if unknown:  # something we never write: kept visible, so the table differs
        verdict = " ".join([verdict, *unknown]).strip()
    return Rule(tuple(matches), verdict, counter, r.get("comment"), packets, tuple(statements))


def from_json(listing: Mapping[str, Any] | None) -> Table | None:
    """The model of a live table from `nft -j list table`, None if there is no table."""
    if listing is None:
        return None
    sets: list[Set] = []
    chains: dict[str, dict[str, Any]] = {}
    rules: dict[str, list[Rule]] = {}
    name = NAME
    for item in listing.get("nftables", []):
        if "table" in item:
            name = str(item["table"].get("name") or NAME)
        elif "set" in item:
            s = item["set"]
            kind = s.get("type", "")
            sets.append(
                Set(
                    s["name"],
                    " . ".join(kind) if isinstance(kind, list) else kind,
                    tuple(s.get("flags", [])),
                    tuple(
                        sorted(
                            _element(e, "interval" in s.get("flags", [])) for e in s.get("elem", [])
                        )
                    ),
                    int(s.get("size", 0)),
                    int(s.get("timeout", 0)),
                )
            )
        elif "chain" in item:
            chains[item["chain"]["name"]] = item["chain"]
        elif "rule" in item:
            rules.setdefault(item["rule"].get("chain", ""), []).append(_reduce_rule(item["rule"]))
    return Table(
        tuple(sets),
        tuple(
            Chain(
                chain,
                c.get("type", ""),
                c.get("hook", ""),
                int(c.get("prio", 0)),
                c.get("policy", ""),
                tuple(rules.get(chain, [])),
            )
            for chain, c in chains.items()
        ),
        name,
    )


def differences(want: Table, have: Table | None, any_elements: tuple[str, ...] = ()) -> list[str]:
    """What is wrong with the live table, one line each; empty when it is exactly right.
    Sets named in `any_elements` are compared but for their elements (filled at run time
    from data the caller does not have: the readiness probe knows no sandbox addresses)."""
    if have is None:
        return [f"table {FAMILY} {want.name} is missing"]

    # a dynamic set's elements are the packet path's (read back, never compared)
    loosened = (*any_elements, *(s.name for s in want.sets if s.dynamic))

    def loose(sets: tuple[Set, ...]) -> tuple[Set, ...]:
        return tuple(
            replace(s, elements=(), dynamic=False) if s.name in loosened else s for s in sets
        )

    out: list[str] = []
    for kind, wanted, found in (
        ("set", loose(want.sets), loose(have.sets)),
        ("chain", want.chains, have.chains),
    ):
        w = {x.name: x for x in wanted}
        h = {x.name: x for x in found}
        for name in sorted(w.keys() | h.keys()):
            if w.get(name) != h.get(name):
                out.append(f"{kind} {name}: want {w.get(name)}, have {h.get(name)}")
    return out


class _State(msgspec.Struct, frozen=True):
    config: str  # the digest of the config the table was made for
    table: Table


def dump_state(config: str, table: Table) -> bytes:
    """What an agent last applied, for its readiness probe (`check --state-file`)."""
    return msgspec.json.encode(_State(config, table))


def load_state(data: bytes) -> tuple[str, Table]:
    """(config digest, table) of `dump_state`; ValueError when it is not one."""
    try:
        state = msgspec.json.decode(data, type=_State)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise ValueError(f"not an agent's state: {exc}") from None
    return state.config, state.table
