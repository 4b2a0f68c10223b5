"""A loopback port a connect is refused on, for the tests of "nothing answers there".

A port bound and then closed is free again at once: while the test runs, another xdist
worker's server, a sandbox self-test's listener or a client's own ephemeral port can
take it, and the test's "refused" becomes a connection to somebody else. Held bound
without ``listen``, the port refuses every connect and nothing else can have it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback TCP port that refuses connections until the block ends."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])
