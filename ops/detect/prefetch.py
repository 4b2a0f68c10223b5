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
file is not worth a process).

The child is forked with :func:`os.fork`, not started as a ``multiprocessing.Process``:
it starts at once and needs no imports, and it runs none of the handlers libraries
register with ``multiprocessing.util.register_after_fork``. Those are written for
worker processes that go on using the library; kombu's, for one, closes every pooled
broker connection the caller holds, and a channel waiting in ``BRPOP`` never answers
the close, so the child hung before it read a byte (a caller that had used Celery in
the same process waited forever). This child touches nothing but its file and its
pipe, and leaves with :func:`os._exit`, so no ``atexit`` handler or buffered stream of
the caller's runs twice.
"""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
from collections.abc import Generator
from multiprocessing.connection import Connection
from typing import NoReturn

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
    inbox, outbox = multiprocessing.Pipe(duplex=False)
    try:
        pid = os.fork()
    except OSError:  # no process to be had (limits): read here, only slower
        inbox.close()
        outbox.close()
        yield from (scan_chunk(chunk, tally) for chunk in read_chunks(tally))
        return
    if pid == 0:  # the child
        _child(tally.path, inbox, outbox)
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
        _reap(pid)


def _reap(pid: int) -> None:
    """Wait for the child, which leaves once its pipe is closed; kill it if it does not."""
    try:
        handle = os.pidfd_open(pid)
        try:
            if not select.select([handle], [], [], JOIN_TIMEOUT_S)[0]:
                signal.pidfd_send_signal(handle, signal.SIGKILL)
        finally:
            os.close(handle)
        os.waitpid(pid, 0)
    except (ChildProcessError, ProcessLookupError):  # reaped already: SIGCHLD is ignored
        pass


def _child(path: str, inbox: Connection, outbox: Connection) -> NoReturn:
    """The forked child: read, then leave without running anything of the caller's."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle
        inbox.close()  # fork's copy: with it open, a caller gone early would never be noticed
        _read(path, outbox)
        code = 0
    finally:  # whatever was raised, never back into the caller's stack: the caller
        os._exit(code)  # sees the pipe close without an "end" and says the reader died


def _read(path: str, outbox: Connection) -> None:
    """Read and pick every chunk, in order, then say how reading ended."""
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
