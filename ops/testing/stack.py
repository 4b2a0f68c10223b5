"""Start the pieces of a local slotrunner (tool server, workers) as child processes.

Used by ``slotrunner demo`` and by the integration tests, so both run exactly the
processes an operator would run from the Procfile.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import httpx

from ops.errors import OpsError
from ops.testing.listener import group_listens_on
from runner.core.poll import PollTimeout, poll_until


class StackError(OpsError):
    """A child process did not come up."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stack_env(base: Mapping[str, str], **overrides: str) -> dict[str, str]:
    env = dict(base)
    env.update(overrides)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class Child:
    """A child process in its own process group, stopped as a whole."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv,
            env=dict(env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.alive():
            self.signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.proc.wait(5)
        # Prefork children may outlive a parent that died first.
        self.signal_group(signal.SIGKILL)
        self._log.close()

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def slotrunner_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "runner.cli.main", *args]


def start_toolserver(
    env: Mapping[str, str],
    port: int,
    log_dir: Path,
    *,
    max_concurrent: int = 16,
    timeout_s: float = 30.0,
    fence: bool = True,
    faults: Path | None = None,
    noop_effect: bool = False,
) -> Child:
    """``slotrunner toolserver``; with the fence off, a fault plan's directory or
    ``write_file``'s effect skipped, the test server ``ops.testing.toolserver`` that
    takes them."""
    args = ["--port", str(port), "--max-concurrent", str(max_concurrent)]
    if fence and faults is None and not noop_effect:
        argv = slotrunner_argv("toolserver", *args)
    else:
        if not fence:
            args += ["--fence", "off"]
        if faults is not None:
            args += ["--faults", str(faults)]
        if noop_effect:
            args += ["--effect", "noop"]
        argv = [sys.executable, "-m", "ops.testing.toolserver", *args]
    child = Child("toolserver", argv, env, log_dir / "toolserver.out")
    wait_http(child, f"http://127.0.0.1:{port}/healthz", timeout_s)
    return child


def wait_http(child: Child, url: str, timeout_s: float) -> None:
    """Until ``child`` answers ``url``: any answer below 500 (with a token, /healthz
    answers 401) from a socket ``child`` itself listens on (ops/testing/listener.py)."""
    port = httpx.URL(url).port

    def answered() -> bool:
        if not child.alive():
            raise StackError(f"{child.name} exited early:\n{child.tail()}")
        try:
            up = httpx.get(url, timeout=1.0).status_code < 500
        except httpx.TransportError:
            return False
        return up and (port is None or group_listens_on(child.pid, port))

    try:
        poll_until(answered, timeout_s, 0.1)
    except PollTimeout:
        child.stop()
        raise StackError(
            f"{child.name} did not answer {url} within {timeout_s:g}s:\n{child.tail()}"
        ) from None


def start_worker(
    env: Mapping[str, str],
    log_dir: Path,
    *,
    name: str = "worker",
    concurrency: int = 2,
    pool: str = "prefork",
    unacked_restore_s: float | None = None,
    attempt_floor: bool = True,
    faults: Path | None = None,
) -> Child:
    """``slotrunner worker``; with a test option (``unacked_restore_s``, no
    ``attempt_floor``, a fault plan's directory), the test worker
    ``ops.testing.worker`` that takes it."""
    args = [
        *("--concurrency", str(concurrency)),
        *("--pool", pool),
        *("--hostname", f"{name}-{os.getpid()}@%h"),
    ]
    if unacked_restore_s is None and attempt_floor and faults is None:
        argv = slotrunner_argv("worker", *args)
    else:
        if unacked_restore_s is not None:
            args += ["--unacked-restore-s", str(unacked_restore_s)]
        if not attempt_floor:
            args.append("--no-attempt-floor")
        if faults is not None:
            args += ["--faults", str(faults)]
        argv = [sys.executable, "-m", "ops.testing.worker", *args]
    return Child(name, argv, env, log_dir / f"{name}.out")
