"""The lanes' port picker: a port handed out is listenable, outside the kernel's ephemeral
range (where every outgoing connection takes its source port), and never handed out twice."""

from __future__ import annotations

import socket

from hack.localcluster import controlplane
from hack.localcluster.controlplane import free_port


def test_ports_are_distinct_and_below_the_ephemeral_range() -> None:
    floor = controlplane._ephemeral_floor()
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)
    assert all(controlplane._LISTEN_FLOOR <= p < floor for p in ports)


def test_a_port_someone_listens_on_is_skipped() -> None:
    with socket.create_server(("127.0.0.1", controlplane._next_port[0] or free_port() + 1)) as held:
        taken = held.getsockname()[1]
        controlplane._next_port[0] = taken
        assert free_port() != taken
