"""`celery -A runner.celery_app ...` as any Celery user runs it: the app is built from the
environment on first use, answers `inspect ping` from a real `slotrunner worker`, and a
worker started by Celery's own command refuses an evicting Redis as ours does."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from ops.testing.stack import start_worker
from runner.core import keys
from runner.core.settings import Settings
from runner.redis_server import EmbeddedRedis
from tests.support.stack import wait_until
from tests.support.toolserver import child_env

REPO = Path(__file__).resolve().parents[2]


def celery(
    env: dict[str, str], *args: str, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "runner.celery_app", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_importing_the_module_builds_nothing_and_connects_nowhere(tmp_path: Path) -> None:
    """Import, then even build the app: no connection to its Redis, no embedded server."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        home = tmp_path / "home"
        code = (
            "import runner.celery_app as m\n"
            "assert m._built == [], 'built at import'\n"
            "app = m.app\n"
            "assert app is m.celery and m._built == [app]\n"
            "print(app.conf.broker_url, app.conf.task_default_queue)\n"
        )
        env = {
            **os.environ,
            "REDIS_URL": f"redis://127.0.0.1:{port}/0",
            "SLOTRUNNER_HOME": str(home),
        }
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == [f"redis://127.0.0.1:{port}/0", "slotrunner"]
        try:
            listener.accept()[0].close()
            connected = True
        except BlockingIOError:
            connected = False
    assert not connected, "importing or building the app opened a connection"
    assert not home.exists()  # no embedded Redis, no slot layout


def test_celery_inspect_ping_answers_pong_from_a_slotrunner_worker(
    settings: Settings, tmp_path: Path
) -> None:
    """A real `slotrunner worker`; `python -m celery -A runner.celery_app inspect ping` with
    the same environment gets its pong. The worker also beats for `slots list --pool`."""
    env = child_env(settings)
    worker = start_worker(env, tmp_path / "logs", name="ping", concurrency=1, pool="solo")
    try:
        import redis

        client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
        wait_until("the worker's host beat", lambda: client.exists(keys.host_alive(settings.host)))
        node = f"ping-{os.getpid()}@{socket.gethostname()}"
        proc = celery(env, "inspect", "ping", "--destination", node, "--timeout", "10")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert node in proc.stdout and "pong" in proc.stdout, proc.stdout
        listed = subprocess.run(
            [sys.executable, "-m", "runner.cli.main", "slots", "list", "--pool", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.returncode == 0, listed.stderr
        mine = next(h for h in json.loads(listed.stdout) if h["host"] == settings.host)
        assert mine["status"] == "live"
        assert [(s["slot_id"], s["state"]) for s in mine["slots"]] == [
            ("S0", "idle"),
            ("S1", "idle"),
        ]
        client.close()
    finally:
        worker.stop()


def test_a_worker_started_by_celery_refuses_an_evicting_redis(
    settings: Settings, tmp_path: Path
) -> None:
    """`celery -A runner.celery_app worker` against a Redis that may evict our keys exits
    with the reason before it takes a job, as `slotrunner worker` refuses it."""
    server = EmbeddedRedis(tmp_path / "evicting")
    url = server.ensure()
    try:
        import redis

        client = redis.Redis.from_url(url)
        client.config_set("maxmemory-policy", "allkeys-lru")
        client.close()
        env = child_env(settings.with_(redis_url=url))
        proc = celery(env, "worker", "--pool", "solo", "--without-mingle", timeout_s=30)
    finally:
        server.leave()
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "refusing to start" in output and "allkeys-lru" in output, output[-2000:]
