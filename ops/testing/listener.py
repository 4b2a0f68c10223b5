"""Whose socket listens on a port: the check that a server which answered is the
child just started, and not another test's server that took the same port first.

``free_port`` hands out a port nobody holds at that instant; two processes asking at
once (the suite runs two at a time) may be handed the same one. The second server
then fails to bind, and until it exits its health URL is answered by the first one,
which serves another home: a test would run against a stranger. Read from
``/proc/<pid>/net`` so a child in a network namespace of its own is seen in it.
"""

from __future__ import annotations

import os
from pathlib import Path

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's ``st`` column


def listening_inodes(pid: int, port: int) -> set[str]:
    """The inodes of the sockets listening on ``port`` in ``pid``'s network namespace."""
    found: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            listening = len(fields) > 9 and fields[3] == LISTEN
            if listening and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def group_sockets(pgid: int) -> set[str]:
    """The inodes of every socket a process of process group ``pgid`` holds open."""
    held: set[str] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            fds = os.listdir(f"/proc/{entry}/fd")
        except (OSError, IndexError, ValueError):
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                held.add(target[len("socket:[") : -1])
    return held


def group_listens_on(pgid: int, port: int) -> bool:
    """Whether a process of group ``pgid`` (a child started in a session of its own)
    holds the socket listening on ``port``."""
    return bool(listening_inodes(pgid, port) & group_sockets(pgid))
