"""Addresses off loopback for test hosts: network namespaces the test makes itself.

Each test host's tool server listens in a namespace of its own, reached from the root
namespace over a veth pair on a private /24 (``10.231.X.0/24``: ``.1`` on the root
side, ``.2`` in the namespace), so it binds an address that is not loopback and must
require its token (docs/architecture.md §Several hosts). Workers stay in the root
namespace, where the embedded Redis listens on 127.0.0.1, and reach their host's tool
server over its veth; so could any other host's worker, which is what the token is for.

This takes root and ``ip netns``. Elsewhere :class:`Network` falls back to loopback
(every host on 127.0.0.1 at its own port) and says so in :attr:`Network.kind`: a test
asserts which path it took (:func:`netns_unavailable`), so a machine that could use
namespaces never passes on loopback unseen.

Everything made here is named ``srh<pid>...``/``srv<pid>...`` and removed by
:meth:`Network.close`; what a run killed before its cleanup left behind is removed by
the next run (:func:`_remove_orphans`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal

from filelock import FileLock

LOOPBACK = "127.0.0.1"
SUBNET = "10.231"
# Serializes the choice of a free /24 between test sessions on this machine.
_LOCK = "/tmp/slotrunner-test-netns.lock"
_OURS = re.compile(r"^srh(\d+)x(\d+)$")


class NetnsError(RuntimeError):
    """An ``ip`` command failed although namespaces were available."""


@dataclass(frozen=True)
class Address:
    """Where one host's tool server listens: an IP, and the namespace it is in (if any)."""

    ip: str
    netns: str | None = None

    def prefix(self) -> list[str]:
        """The argv prefix that runs a command in this address's namespace."""
        return ["ip", "netns", "exec", self.netns] if self.netns else []


def netns_unavailable() -> str | None:
    """Why this machine cannot give test hosts namespaces of their own, or None."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None:
        return "no `ip` command"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"`ip netns list` failed: {probe.stderr.strip()[:200]}"
    return None


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_orphans() -> None:
    """Namespaces (and their veths) of earlier runs of this module whose process is gone."""
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        found = _OURS.match(name)
        if found and not _pid_alive(int(found.group(1))):
            _kill_inside(name)
            with contextlib.suppress(NetnsError):
                _ip("link", "del", _veth(int(found.group(1)), int(found.group(2))))
            with contextlib.suppress(NetnsError):
                _ip("netns", "del", name)


def _kill_inside(netns: str) -> None:
    """SIGKILL what a test started in one of these namespaces (nothing else runs there)."""
    with contextlib.suppress(NetnsError):
        for pid in _ip("netns", "pids", netns).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)


def _veth(pid: int, index: int) -> str:
    """The root side's veth name (at most 15 characters, as the kernel wants)."""
    return f"srv{pid % 100000}x{index}"


def _free_third_octets(count: int) -> list[int]:
    used = {
        int(m.group(1))
        for m in re.finditer(rf"inet {re.escape(SUBNET)}\.(\d+)\.", _ip("-o", "-4", "addr", "show"))
    }
    free = [x for x in range(1, 255) if x not in used]
    if len(free) < count:
        raise NetnsError(f"no {count} free /24 left under {SUBNET}.0.0/16")
    return free[:count]


class Network:
    """``count`` addresses for test hosts: namespaces where possible, else loopback."""

    def __init__(self, count: int, *, prefer_netns: bool = True) -> None:
        self.count = count
        self.why_loopback = netns_unavailable() if prefer_netns else "loopback asked for"
        self.kind: Literal["netns", "loopback"] = "loopback" if self.why_loopback else "netns"
        self.addresses: list[Address] = []
        self._made: list[tuple[str, str]] = []  # (namespace, root-side veth)
        if self.kind == "loopback":
            self.addresses = [Address(LOOPBACK) for _ in range(count)]
            return
        try:
            with FileLock(_LOCK, timeout=30):
                _remove_orphans()
                for index, octet in enumerate(_free_third_octets(count)):
                    self.addresses.append(self._make(index, octet))
        except BaseException:
            self.close()
            raise

    def _make(self, index: int, octet: int) -> Address:
        pid = os.getpid()
        netns, outer, inner = f"srh{pid}x{index}", _veth(pid, index), f"in{index}"
        _ip("netns", "add", netns)
        self._made.append((netns, outer))
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner, "netns", netns)
        _ip("addr", "add", f"{SUBNET}.{octet}.1/24", "dev", outer)
        _ip("link", "set", outer, "up")
        _ip("-n", netns, "addr", "add", f"{SUBNET}.{octet}.2/24", "dev", inner)
        _ip("-n", netns, "link", "set", inner, "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        return Address(f"{SUBNET}.{octet}.2", netns)

    def pids(self, address: Address) -> list[int]:
        """The processes still in that address's namespace (none on loopback)."""
        if address.netns is None:
            return []
        return [int(p) for p in _ip("netns", "pids", address.netns).split()]

    def close(self) -> None:
        """Remove every namespace and veth made here; their processes are the tests'."""
        for netns, outer in reversed(self._made):
            _kill_inside(netns)
            with contextlib.suppress(NetnsError):
                _ip("link", "del", outer)
            with contextlib.suppress(NetnsError):
                _ip("netns", "del", netns)
        self._made.clear()
