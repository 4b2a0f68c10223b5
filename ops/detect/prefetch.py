"""Read a big input in a second process, so that two cores share the work.

Reading, decompressing and sorting out chunks (:func:`ops.detect.scan.pick`: all C, about
half the cost) runs in a forked child; decoding the candidates and replaying them
(:func:`ops.detect.scan.take`, then the rules) stay in the caller, where the state is. The
child sends each chunk's :class:`ops.detect.scan.Picked` (the candidates as one JSON array,
so a message is one bytes object and a short list of line numbers), or the raw chunk
when some line needs the line-by-line road, which the caller then walks itself.
Line numbers are the child's, counted over every line it read.

The pipe holds a message or two, so the child is never more than a couple of chunks
ahead: memory stays constant. If either side dies the other sees the pipe close: the
caller records ``tally.error`` and stops; the child exits. Only a single input, a file
of at least :data:`MIN_BYTES`, is read this way (stdin belongs to the caller; a small
file is not worth a process). The child is forked: it starts at once and needs no
imports, and the callers (one-shot ``ops detect``, tests) run no threads to fork with.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Generator
from multiprocessing.connection import Connection

from ops.detect.scan import Batch, Tally, pick, read_chunks, scan_chunk, take

MIN_BYTES = 32 << 20
JOIN_TIMEOUT_S = 5.0


def worth_it(tally: Tally) -> bool:
    """A plain file big enough, and a second core to read it on."""
    if tally.path == "-" or len(os.sched_getaffinity(0)) < 2:
        return False
    try:
        return os.path.getsize(tally.path) >= MIN_BYTES
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return False  # the caller's own reader reports it


def batches(tally: Tally) -> Generator[Batch, None, None]:
    """The batches of ``tally.path``, read by a child process; counts go to ``tally``."""
    # fork, not spawn: the child needs no imports and starts in a millisecond
    ctx = multiprocessing.get_context("fork")
    inbox, outbox = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_read, args=(tally.path, inbox, outbox), daemon=True)
    try:
        child.start()
    except OSError:  # no process to be had (limits): read here, only slower
        inbox.close()
        outbox.close()
        yield from (scan_chunk(chunk, tally) for chunk in read_chunks(tally))
        return
    outbox.close()  # the child's end: once it exits, recv() sees EOF
    try:
        while True:
            try:
                kind, body = inbox.recv()
            except EOFError:
                tally.error = "the reading process died"
                return
            if kind == "picked":
                yield take(body, tally)
            elif kind == "chunk":
                yield scan_chunk(body, tally)
            else:
                tally.error = body
                return
    finally:
        inbox.close()
        child.join(JOIN_TIMEOUT_S)
        if child.is_alive():  # it should have seen the pipe close; make sure it is gone
            child.terminate()
            child.join()


def _read(path: str, inbox: Connection, outbox: Connection) -> None:
    """The child: read and pick every chunk, in order, then say how reading ended."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle
    inbox.close()  # fork's copy: with it open, a caller gone early would never be noticed
    tally, first = Tally(path), 1
    try:
        for chunk in read_chunks(tally):
            picked = pick(chunk, first)
            if picked is None:
                outbox.send(("chunk", chunk))
                first += chunk.count(b"\n") + (chunk[-1:] != b"\n")
            else:
                outbox.send(("picked", picked))
                first += picked.lines
        outbox.send(("end", tally.error))
    except OSError:  # BrokenPipeError: the caller is gone; nobody to tell
        pass
    finally:
        outbox.close()
