"""Run inside a network namespace (`ip netns exec NS python3 hack/localcluster/netns_tool.py ...`).

listen PORT [PORT...]         accept and echo on each port until killed (prints "ready")
connect HOST PORT [TIMEOUT]   one connect: prints connected/refused/timeout and the time
connect-from SRC HOST PORT [TIMEOUT]
                              the same from source address SRC, which need not be local
                              (IP_TRANSPARENT, as IPVS sends a client pod's packets)
connects HOST PORT N          N connects; prints JSON {outcome: count, latencies_us: [...]}
hold HOST PORT                connect, print "held", wait for a line on stdin, then send
                              and receive: prints "alive" or the error (e.g. reset)
ipip DEV LOCAL REMOTE         an IPIP tunnel (RFC 2003) to REMOTE: a TUN device DEV whose
                              packets travel as IP protocol 4, as a kernel ipip device sends
                              them; for kernels without CONFIG_NET_IPIP (prints "ready")
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

BUFFER = 4096


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def listen(ports: list[int]) -> None:
    def serve(sock: socket.socket) -> None:
        while True:
            conn, _ = sock.accept()
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    def echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(BUFFER):
                conn.sendall(data)

    for port in ports:
        for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):  # noqa: S104
            s = socket.socket(family, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((addr, port))
            s.listen(4096)  # rapid sequential connects must never find the queue full
            threading.Thread(target=serve, args=(s,), daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()


IP_TRANSPARENT = 19  # linux/in.h; IPV6_TRANSPARENT is 75


def connect_once(
    host: str, port: int, timeout: float, source: str | None = None
) -> tuple[str, float]:
    s = socket.socket(_family(host), socket.SOCK_STREAM)
    s.settimeout(timeout)
    if source is not None:
        if ":" in host:
            s.setsockopt(socket.IPPROTO_IPV6, 75, 1)
        else:
            s.setsockopt(socket.IPPROTO_IP, IP_TRANSPARENT, 1)
        s.bind((source, 0))
    started = time.perf_counter()
    try:
        s.connect((host, port))
        outcome = "connected"
    except ConnectionRefusedError:
        outcome = "refused"  # a TCP reset in answer to the SYN
    except TimeoutError:
        outcome = "timeout"
    except OSError as exc:
        outcome = f"error:{exc.errno}"
    elapsed = time.perf_counter() - started
    s.close()
    return outcome, elapsed


def ipip(dev: str, local: str, remote: str) -> None:
    """Encapsulate what the TUN device `dev` is given in IPv4 protocol 4 to `remote`, and
    hand what arrives from `remote` (the outer header taken off) to the device."""
    import fcntl
    import os
    import select
    import struct

    tunsetiff, iff_tun, iff_no_pi = 0x400454CA, 0x0001, 0x1000
    tun = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(tun, tunsetiff, struct.pack("16sH", dev.encode(), iff_tun | iff_no_pi))
    wire = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_IPIP)
    wire.bind((local, 0))
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([tun, wire.fileno()], [], [])
        if tun in ready:
            packet = os.read(tun, 65535)
            if packet and packet[0] >> 4 == 4:  # IPIP carries IPv4 only
                wire.sendto(packet, (remote, 0))
        if wire.fileno() in ready:
            outer, (source, _) = wire.recvfrom(65535)
            if source == remote:
                os.write(tun, outer[(outer[0] & 0x0F) * 4 :])


def main() -> None:
    cmd, *args = sys.argv[1:]
    if cmd == "listen":
        listen([int(p) for p in args])
    elif cmd == "connect":
        outcome, elapsed = connect_once(
            args[0], int(args[1]), float(args[2]) if len(args) > 2 else 2.0
        )
        print(outcome, f"{elapsed * 1e6:.1f}")
    elif cmd == "connect-from":
        outcome, elapsed = connect_once(
            args[1], int(args[2]), float(args[3]) if len(args) > 3 else 2.0, source=args[0]
        )
        print(outcome, f"{elapsed * 1e6:.1f}")
    elif cmd == "connects":
        host, port, n = args[0], int(args[1]), int(args[2])
        counts: dict[str, int] = {}
        latencies = []
        for _ in range(n):
            outcome, elapsed = connect_once(host, port, 2.0)
            counts[outcome] = counts.get(outcome, 0) + 1
            latencies.append(round(elapsed * 1e6, 2))
        print(json.dumps({"outcomes": counts, "latencies_us": latencies}))
    elif cmd == "hold":
        s = socket.socket(_family(args[0]), socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect((args[0], int(args[1])))
        s.sendall(b"hello")
        s.recv(BUFFER)
        print("held", flush=True)
        sys.stdin.readline()
        try:
            s.sendall(b"again")
            data = s.recv(BUFFER)
            print("alive" if data else "closed", flush=True)
        except OSError as exc:
            print(f"error:{type(exc).__name__}", flush=True)
    elif cmd == "ipip":
        ipip(args[0], args[1], args[2])
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
