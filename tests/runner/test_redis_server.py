"""The embedded Redis restarted in place: with its data, and empty (the chaos fault)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runner.redis_server import EmbeddedRedis, RedisUnavailable


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    embedded = EmbeddedRedis(tmp_path / "home")
    yield embedded
    embedded.leave()


def test_restart_keeps_the_port_and_the_data(server: EmbeddedRedis) -> None:
    url = server.ensure()
    client = redis.Redis.from_url(url, decode_responses=True)
    client.set("k", "v")
    old_pid = server._read_state()["pid"]  # type: ignore[index]

    assert server.restart(wipe=False) == url

    assert server._read_state()["pid"] != old_pid  # type: ignore[index]
    assert client.get("k") == "v"  # the same client reconnects to the same URL
    client.close()


def test_restart_with_wipe_comes_back_empty_on_the_same_port(server: EmbeddedRedis) -> None:
    url = server.ensure()
    client = redis.Redis.from_url(url, decode_responses=True)
    client.set("k", "v")
    client.incr("counter")

    assert server.restart(wipe=True) == url

    assert client.dbsize() == 0
    assert client.incr("counter") == 1
    client.close()


def test_restart_without_a_server_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RedisUnavailable, match="no embedded Redis runs"):
        EmbeddedRedis(tmp_path / "nothing").restart(wipe=True)


def test_the_port_is_chosen_below_the_ephemeral_range() -> None:
    """Outgoing connections (a client reconnecting to the dead server's port included)
    take their local ports from the ephemeral range; the server's port is never one."""
    from runner.redis_server import _ephemeral_low, _free_port

    low = _ephemeral_low()
    if low <= 11000:
        pytest.fail(f"this host's ephemeral range starts at {low}: no room below it")
    assert all(10000 <= _free_port() < low for _ in range(20))
