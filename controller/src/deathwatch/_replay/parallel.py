"""Read a large recorded file on several cores.

The stateless work (finding values, decoding, validating, deriving pod views) runs in forked
worker processes on pieces of the file; the engine, which must see events in order, runs in
the calling process on their results.

Pieces are cut where one top-level value ends and the next begins on a new line ("}\\n{"):
in valid JSON that sequence occurs nowhere else (a string cannot hold a raw newline, and
pretty-printers indent every nested brace), so each piece holds whole values; a stretch
without one simply joins the next piece. The file is memory-mapped before the fork, so
workers read their pieces from the shared mapping and only results (msgpack, ~500 bytes per
event) cross a pipe; shipping the JSON itself through pipes cost more than decoding it.
Worker k takes pieces k, k+W, k+2W... and writes each result to its own pipe; the parent
reads them back in piece order. A full pipe blocks the worker, so memory stays bounded.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import signal
import stat
import struct
from collections.abc import Iterator
from typing import BinaryIO

import msgspec

from deathwatch._replay.events import DECODER, SkippedEvent, ViewEvent, view_events
from deathwatch._replay.stream import RawValue, StreamError, read_values

PIECE_SIZE = 2 << 20
_FRAME = struct.Struct("<Q")


class _Result(msgspec.Struct, array_like=True, gc=False):
    values: int  # top-level values in the piece (event indexes are counted in values)
    events: list[ViewEvent | SkippedEvent]
    error: tuple[int, int, str] | None = None  # (local index, local offset, message)
    crash: str | None = None  # an unexpected exception in the worker


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(_Result)


def decode_piece(piece: bytes, first: int = 1) -> _Result:
    """One piece of the recording to validated events (what a worker does); `first` is the
    index of its first value in the whole recording, as the parent counted it (events are
    numbered as in the file); `values` is how many it held."""
    count = 0
    shift = first - 1

    def counted() -> Iterator[RawValue]:
        nonlocal count
        for value in read_values(io.BytesIO(piece), decode=DECODER.decode):
            count = value.index
            yield RawValue(value.index + shift, value.offset, value.value) if shift else value

    events: list[ViewEvent | SkippedEvent] = []
    try:
        events.extend(view_events(counted()))
    except StreamError as exc:
        return _Result(count, events, (exc.index, exc.offset, exc.message))
    return _Result(count, events)


def pieces(mapped: mmap.mmap | bytes, size: int = PIECE_SIZE) -> list[tuple[int, int]]:
    """(start, end) of the pieces of the data, each ending between top-level values."""
    out: list[tuple[int, int]] = []
    start, total = 0, len(mapped)
    while start < total:
        end = start + size
        if end >= total:
            out.append((start, total))
            break
        cut = mapped.rfind(b"}\n{", start, end)
        while cut < 0 and end < total:  # no boundary in this stretch: take more
            end = min(end + size, total)
            cut = mapped.rfind(b"}\n{", start, end) if end < total else -1
        if cut < 0:
            out.append((start, total))
            break
        out.append((start, cut + 2))
        start = cut + 2
    return out


def regular_file(stream: BinaryIO) -> int | None:
    """The descriptor of a non-empty regular file behind the stream, else None."""
    try:
        fd = stream.fileno()
        info = os.fstat(fd)
    except (OSError, AttributeError, io.UnsupportedOperation):
        return None
    return fd if stat.S_ISREG(info.st_mode) and info.st_size > 0 else None


def _worker(mapped: mmap.mmap, spans: list[tuple[int, int]], firsts: list[int], out: int) -> None:
    for (start, end), first in zip(spans, firsts, strict=True):
        try:
            result = decode_piece(mapped[start:end], first)
        except Exception as exc:  # report, never hang the parent
            result = _Result(0, [], crash=f"{type(exc).__name__}: {exc}")
        data = _ENCODER.encode(result)
        os.write(out, _FRAME.pack(len(data)))
        view = memoryview(data)
        while view:
            view = view[os.write(out, view) :]


def _read_exact(fd: int, size: int) -> bytes:
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise RuntimeError("a replay worker exited before sending its results")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


class ParallelEvents:
    """The same events as view_events(read_values(file)), in order, decoded by `jobs` forked
    workers. For regular files only (see regular_file). `position` is how far into the file
    the events yielded so far reach."""

    def __init__(self, fd: int, jobs: int, piece_size: int | None = None) -> None:
        self.fd = fd
        self.jobs = max(1, jobs)
        self.piece_size = piece_size or PIECE_SIZE
        self.position = 0
        self._firsts: list[int] = []

    def __iter__(self) -> Iterator[ViewEvent | SkippedEvent]:
        with mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ) as mapped:
            spans = pieces(mapped, self.piece_size)
            # each piece's first event number, counted where the pieces were cut: values meet
            # at "}\n{" (the module docstring), so the workers number their events as in the
            # file and the parent hands them on as they come; a piece whose count proves
            # otherwise is renumbered here
            firsts, counted = [], 1
            for start, end in spans:
                firsts.append(counted)
                counted += mapped[start:end].count(b"}\n{") + 1
            self._firsts = firsts
            workers: list[tuple[int, int]] = []  # (pid, read end)
            try:
                for k in range(min(self.jobs, len(spans))):
                    read_end, write_end = os.pipe()
                    pid = os.fork()
                    if pid == 0:  # pragma: no cover - runs in the child
                        code = 0
                        try:
                            os.close(read_end)
                            mine = slice(k, None, self.jobs)
                            _worker(mapped, spans[mine], firsts[mine], write_end)
                        except BaseException:
                            code = 1
                        finally:
                            os._exit(code)
                    os.close(write_end)
                    workers.append((pid, read_end))
                yield from self._collect(spans, workers)
            finally:
                for pid, read_end in workers:
                    os.close(read_end)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)
                    os.waitpid(pid, 0)

    def _collect(
        self, spans: list[tuple[int, int]], workers: list[tuple[int, int]]
    ) -> Iterator[ViewEvent | SkippedEvent]:
        values_before = 0
        for i, (start, end) in enumerate(spans):
            read_end = workers[i % len(workers)][1]
            (size,) = _FRAME.unpack(_read_exact(read_end, _FRAME.size))
            result = _DECODER.decode(_read_exact(read_end, size))
            if result.crash is not None:
                raise RuntimeError(f"replay worker failed: {result.crash}")
            shift = values_before + 1 - self._firsts[i]  # 0 unless a count was wrong
            if shift == 0:
                yield from result.events
            else:
                for event in result.events:
                    if isinstance(event, ViewEvent):
                        yield ViewEvent(event.index + shift, event.type, event.pod)
                    else:
                        yield SkippedEvent(event.index + shift, event.reason)
            if result.error is not None:
                index, offset, message = result.error
                raise StreamError(index + values_before, offset + start, message)
            values_before += result.values
            self.position = end
