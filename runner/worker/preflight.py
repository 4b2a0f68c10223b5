"""Refuse to run against a Redis that may evict the keys the invariants rely on."""

from __future__ import annotations

import redis

from runner.errors import RunnerError

SAFE_POLICIES = {"noeviction", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"}


class PreflightError(RunnerError):
    """This Redis would silently drop generation mirrors, attempts or counters."""


def check_redis(client: redis.Redis) -> list[str]:
    """Raise on an evicting policy; return warnings (e.g. nothing kept on disk)."""
    policy = str(client.config_get("maxmemory-policy").get("maxmemory-policy", "noeviction"))
    # volatile-* policies only evict keys with a TTL; ours that must survive have none.
    if policy not in SAFE_POLICIES:
        raise PreflightError(
            f"Redis maxmemory-policy is {policy!r}: it may evict generation mirrors and "
            "attempt numbers. Set it to noeviction (CONFIG SET maxmemory-policy noeviction)."
        )
    warnings = []
    conf = client.config_get("save")
    aof = client.config_get("appendonly").get("appendonly", "no")
    if not conf.get("save") and aof != "yes":
        warnings.append(
            "Redis keeps nothing on disk (no RDB snapshots, no AOF): after a Redis restart "
            "the local slot stamps alone keep generations monotonic"
        )
    return warnings
