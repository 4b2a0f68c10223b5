"""Several hosts on one machine sharing one Redis, each killed, frozen and restarted whole.

A :class:`Host` is what docs/architecture.md §Several hosts calls a host: its own
:class:`Settings` (``SLOTRUNNER_HOST_ID``, home, tool server URL, ``SLOTRUNNER_TOKEN``),
its own tool server and Celery worker processes, and its own log. Every process of a
host is in ONE process group (the tool server leads it, the workers join it), so
:meth:`Host.signal` SIGKILLs, SIGSTOPs or SIGCONTs the whole host with one
``killpg``: no process of it runs a step while another is already dead or frozen.
:meth:`Host.start` again on the same home is the host coming back.

Where the machine allows it, each tool server listens in a network namespace of its
own, off loopback (``tests/support/netns.py``); the workers stay in the root
namespace, where the embedded Redis is, and reach their tool server over its veth.

Jobs are gated as in ``tests/support/stack.py`` (a ``run_tests`` waiting for a ``go``
file), and everything else is read from the hosts' JSONL logs.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import httpx
import redis

from ops.testing.stack import free_port
from runner.core.poll import PollTimeout, poll_until
from runner.core.settings import Settings
from tests.support.netns import Address, Network
from tests.support.repos import make_repo
from tests.support.stack import FAST, UNACKED_RESTORE_S, GatedJobs, wait_until
from tests.support.toolserver import child_env
from tools.server.guard import TOKEN_HEADER

NETNS_PORT = 8765  # every namespace has its own ports: each host's server uses this one


class Member:
    """One process of a host, in the host's process group (``group`` 0: it leads it)."""

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], log_path: Path, group: int
    ) -> None:
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - closed in reap()
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            process_group=group,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def reap(self, timeout_s: float = 10.0) -> None:
        self.proc.wait(timeout_s)
        self._log.close()

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def group_pids(pgid: int) -> list[int]:
    """Every live (not zombie) process of a process group, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found


def read_events(path: Path, event: str | None = None, **match: Any) -> list[dict[str, Any]]:
    """The records of a JSONL log (those of ``event`` whose fields equal ``match``)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written right now
        if event is not None and record.get("event") != event:
            continue
        if all(record.get(k) == v for k, v in match.items()):
            out.append(record)
    return out


def when(record: dict[str, Any]) -> datetime:
    """A log record's time (every process of every host stamps UTC from one clock here)."""
    return datetime.fromisoformat(str(record["ts"]))


class Host:
    """One host: settings, address, and the process group of its tool server and workers."""

    def __init__(
        self, name: str, settings: Settings, address: Address, root: Path, **extra_env: str
    ) -> None:
        self.name = name
        self.address = address
        self.port = NETNS_PORT if address.netns else free_port()
        self.settings = settings.with_(toolserver_url=f"http://{address.ip}:{self.port}")
        self.root = root
        self.extra_env = extra_env
        self.members: list[Member] = []
        self.server: Member | None = None  # the tool server of the last start
        self.pgid: int | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return self.settings.toolserver_url

    @property
    def token(self) -> str:
        assert self.settings.token is not None
        return self.settings.token

    def env(self, **extra: str) -> dict[str, str]:
        return child_env(self.settings, **{**self.extra_env, **extra})

    # -- processes ----------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> Member:
        member = Member(name, argv, self.env(), self.root / "logs" / f"{name}.out", self.pgid or 0)
        if self.pgid is None:
            self.pgid = member.pid
        self.members.append(member)
        return member

    def start(
        self, *, fence: bool = True, workers: int = 1, concurrency: int = 1, wait: bool = True
    ) -> None:
        """The tool server (the group's leader), then ``workers`` workers; the shipped
        ``slotrunner toolserver`` unless ``fence`` is off (``ops.testing.toolserver``).
        Without ``wait``, the caller waits (:meth:`wait_healthy`): hosts start together."""
        assert not self.members, f"host {self.name} is already running"
        self.starts += 1
        where = ["--host", self.address.ip, "--port", str(self.port)]
        if fence:
            argv = [sys.executable, "-m", "runner.cli.main", "toolserver", *where]
        else:
            argv = [sys.executable, "-m", "ops.testing.toolserver", *where, "--fence", "off"]
        self.server = self._spawn(f"toolserver-{self.starts}", [*self.address.prefix(), *argv])
        for _ in range(workers):
            self.start_worker(concurrency)
        if wait:
            self.wait_healthy()

    def start_worker(self, concurrency: int = 1) -> Member:
        """The test worker (kombu restores unacked deliveries every second), in this group."""
        assert self.pgid is not None, "start the host's tool server first"
        n = len(self.members)
        return self._spawn(
            f"worker-{self.starts}-{n}",
            [
                *(sys.executable, "-m", "ops.testing.worker"),
                *("--concurrency", str(concurrency), "--pool", "prefork"),
                *("--hostname", f"{self.settings.host}-w{n}@%h"),
                *("--unacked-restore-s", str(UNACKED_RESTORE_S)),
            ],
        )

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        server = self.server
        assert server is not None

        def answered() -> bool:
            if not server.alive():
                raise AssertionError(f"{self.name}'s tool server exited:\n{server.tail()}")
            try:
                reply = httpx.get(
                    f"{self.url}/healthz", headers={TOKEN_HEADER: self.token}, timeout=1.0
                )
            except httpx.TransportError:
                return False
            return reply.status_code == 200

        try:
            poll_until(answered, timeout_s, 0.05)
        except PollTimeout:
            raise AssertionError(
                f"{self.name}'s tool server never answered:\n{server.tail()}"
            ) from None

    def signal(self, sig: int) -> None:
        """``sig`` to every process of the host at once."""
        assert self.pgid is not None, f"host {self.name} is not running"
        os.killpg(self.pgid, sig)

    def kill(self) -> None:
        """SIGKILL the whole host; return once none of its processes is left."""
        if self.pgid is None:
            return
        pgid = self.pgid
        with contextlib.suppress(ProcessLookupError):  # stopped already, in part or whole
            os.killpg(pgid, signal.SIGKILL)
        for member in self.members:
            member.reap()
        # Celery's pool children are not ours to wait for: they die with the group.
        wait_until(f"every process of host {self.name} to die", lambda: not group_pids(pgid))
        self.members, self.pgid, self.server = [], None, None

    def stop(self) -> None:
        """Shut the whole host down (SIGTERM, then SIGKILL what is left)."""
        if self.pgid is None:
            return
        try:
            self.signal(signal.SIGCONT)  # a stopped group would ignore SIGTERM
            self.signal(signal.SIGTERM)
            for member in self.members:
                member.proc.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        self.kill()

    def stop_member(self, member: Member) -> None:
        """One process's warm shutdown (a worker leaving), the rest of the host running."""
        member.proc.send_signal(signal.SIGTERM)
        member.reap(30)
        self.members.remove(member)

    def workers(self) -> list[Member]:
        return [m for m in self.members if m.name.startswith("worker")]

    def tails(self) -> str:
        return "\n".join(f"--- {self.name} {m.name}\n{m.tail()}" for m in self.members)

    # -- the host's log and slots -------------------------------------------------------

    def events(self, event: str | None = None, **match: Any) -> list[dict[str, Any]]:
        return read_events(self.settings.log_path, event, **match)

    def wait_event(
        self, what: str, event: str, timeout_s: float = 40.0, **match: Any
    ) -> dict[str, Any]:
        return wait_until(
            f"{what} on host {self.name}",
            lambda: next(iter(self.events(event, **match)), None),
            timeout_s,
        )

    def work(self, slot_id: str) -> Path:
        return self.settings.slots_dir / slot_id / "work"


class Cluster(GatedJobs):
    """Hosts ``a``, ``b``, ... sharing one Redis (``redis_url``) and one job queue."""

    def __init__(
        self,
        redis_url: str,
        tmp_path: Path,
        network: Network,
        *,
        slots: int = 1,
        **extra_env: str,
    ) -> None:
        tag = secrets.token_hex(3)
        self.network = network
        self.hosts: dict[str, Host] = {}
        for index, address in enumerate(network.addresses):
            name = "abcdefgh"[index]
            root = tmp_path / f"host-{name}"
            (root / "home").mkdir(parents=True)
            settings = Settings.from_env(
                {
                    "SLOTRUNNER_HOME": str(root / "home"),
                    "REDIS_URL": redis_url,
                    "SLOTRUNNER_SLOTS": str(slots),
                    "SLOTRUNNER_HOST_ID": f"host-{name}-{tag}",
                    "SLOTRUNNER_TOKEN": secrets.token_hex(16),
                    "SLOTRUNNER_LEASE_TTL_S": "600",
                }
            )
            self.hosts[name] = Host(name, settings, address, root, **{**FAST, **extra_env})
        self.redis = redis.Redis.from_url(redis_url, decode_responses=True)
        from runner.worker.celery_app import create_app

        self.app = create_app(self.hosts["a"].settings)  # a client: it only sends
        self.repo = tmp_path / "repo"
        self.base = make_repo(self.repo, {"pkg/__init__.py": "", "README": "sample\n"})

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts.values())

    def close(self) -> None:
        try:
            for host in self:
                host.stop()
        finally:
            for host in self:
                host.kill()  # whatever a failed stop left
            self.redis.close()

    def tails(self) -> str:
        return "\n".join(host.tails() for host in self)

    def start(self, **how: Any) -> None:
        """Every host at once (``how`` as :meth:`Host.start`), then wait for their servers."""
        for host in self:
            host.start(wait=False, **how)
        for host in self:
            host.wait_healthy()

    # -- the logs -------------------------------------------------------------------

    def events(self, event: str | None = None, **match: Any) -> list[dict[str, Any]]:
        """Every host's records, merged by time."""
        merged = [r for host in self for r in host.events(event, **match)]
        return sorted(merged, key=when)

    def runs(self, job_id: str, attempt: int, timeout_s: float = 40.0) -> tuple[Host, str]:
        """The host running that attempt, and its slot (from the host's lease line)."""

        def leased() -> tuple[Host, str] | None:
            for host in self:
                found = host.events("slot_leased", job_id=job_id, attempt=attempt)
                if found:
                    return host, str(found[0]["slot_id"])
            return None

        return wait_until(f"{job_id} attempt {attempt} to lease a slot", leased, timeout_s)

    def gate_reached(self, host: Host, slot_id: str) -> None:
        wait_until(
            f"run_tests to start in {host.name}:{slot_id}",
            lambda: (host.work(slot_id) / "started").exists(),
        )

    def open_gate(self, host: Host, slot_id: str) -> None:
        self.gate_reached(host, slot_id)
        (host.work(slot_id) / "go").write_text("")
