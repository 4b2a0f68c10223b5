"""Slots leased on a real tool server's home, exec calls into them, and /proc looked at
from the host (the exec tool's tests)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import redis

from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.core.stamp import Stamp
from runner.slots.pool import SlotPool
from runner.workspace.workspaces import Workspaces


class Slots:
    """Lease, prepare and release slots of ``settings``'s home, as a job runner does."""

    def __init__(self, settings: Settings, repo: Path, base: str) -> None:
        self.client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
        self.settings = settings
        self.pool = SlotPool(settings, self.client, EventLog(settings))
        self.workspaces = Workspaces(settings.home)
        self.repo, self.base = repo, base

    def lease(self, job_id: str) -> Stamp:
        stamp = self.pool.lease(job_id, 1)
        self.workspaces.prepare(self.dir(stamp), str(self.repo), self.base, job_id)
        return stamp

    def release(self, stamp: Stamp) -> None:
        assert stamp.job_id is not None
        self.pool.release(stamp.slot_id, stamp.job_id, stamp.generation)

    def dir(self, stamp: Stamp) -> Path:
        return self.settings.slots_dir / stamp.slot_id

    def work(self, stamp: Stamp) -> Path:
        return self.dir(stamp) / "work"

    def close(self) -> None:
        self.client.close()


def envelope(stamp: Stamp, key: str | None, tool: str = "exec") -> dict[str, Any]:
    return {
        "job_id": stamp.job_id,
        "attempt": stamp.attempt,
        "slot_id": stamp.slot_id,
        "generation": stamp.generation,
        "tool": tool,
        "idempotency_key": key,
    }


def run(url: str, stamp: Stamp, key: str, args: dict[str, Any]) -> httpx.Response:
    """``POST /v1/tools/exec`` with ``stamp``'s envelope."""
    body = {"envelope": envelope(stamp, key), "args": args}
    return httpx.post(f"{url}/v1/tools/exec", json=body, timeout=120)


def procs_with(marker: str) -> list[str]:
    """Every live process (not a zombie) whose command line names ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline and state != "Z":
            shown = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry}: {shown}")
    return found
