"""The checks run after every chaos campaign; each one is named in the report.

Every check is a function over what the run left behind (results, the host's JSONL
log, the slot stamps, /proc) returning a :class:`Check`: pass or fail, a one-line
detail, and the evidence. The log-wide invariants are judged by the operator's own
tools, ``slotrunner ops verify`` and ``slotrunner ops detect``, run as commands.
On several hosts the checks of one host run for each and are joined
(``ops.testing.chaos.hostchecks``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from ops.testing.chaos.plan import ORPHAN_MARK
from runner.core.git import run_git, stderr_of
from runner.core.settings import Settings
from runner.core.stamp import SlotState, Stamp, StampError, read_stamp
from runner.jobs.models import JobResult

STALE_REASONS = frozenset({"stale_generation", "slot_job_mismatch", "lease_expired"})
POISONED_REASON = "slot_poisoned"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail, "data": self.data}


def ops_tool(
    which: str,
    log: Path | Sequence[Path],
    env: Mapping[str, str],
    name: str | None = None,
    *,
    options: Sequence[str] = (),
) -> Check:
    """``slotrunner ops verify|detect --json [OPTIONS] LOG...``: zero violations, exit 0."""
    logs = [log] if isinstance(log, Path) else list(log)
    argv = [
        *(sys.executable, "-m", "runner.cli.main", "ops", which, "--json", *options),
        *map(str, logs),
    ]
    proc = subprocess.run(
        argv, env=dict(env), capture_output=True, text=True, timeout=600, check=False
    )
    items = []
    for line in proc.stdout.splitlines():
        try:
            items.append(json.loads(line))
        except ValueError:
            continue
    summary = next((i for i in items if i.get("kind") == "summary"), None)
    name = name or f"ops_{which}"
    if summary is None:
        tail = (proc.stderr or proc.stdout).strip()[-400:]
        return Check(name, False, f"exit {proc.returncode} without a summary: {tail}")
    counts = summary.get("violations" if which == "verify" else "incidents") or {}
    found = {k: int(v) for k, v in counts.items() if v}
    incidents = [i for i in items if i.get("kind") not in ("summary", "malformed")]
    data = {
        "exit_code": proc.returncode,
        "counts": {k: int(v) for k, v in counts.items()},
        "lines": summary.get("lines"),
        "malformed": summary.get("malformed"),
        "incidents": incidents[:20],
    }
    if which == "verify":
        data["applies"] = summary.get("applies")
        if summary.get("receipts") is not None:
            data["receipts"] = summary["receipts"]
    ok = proc.returncode == 0 and not found
    shown = ", ".join(f"{k} {v}" for k, v in found.items()) or "none"
    return Check(name, ok, f"exit {proc.returncode}; violations: {shown}", data)


def terminal_states(job_ids: Iterable[str], results: Mapping[str, JobResult]) -> Check:
    """Every job ended in one terminal state; every end but success says why."""
    missing = [j for j in job_ids if j not in results]
    unexplained = [j for j, r in results.items() if r.state != "succeeded" and not r.reason]
    explained_success = [j for j, r in results.items() if r.state == "succeeded" and r.reason]
    ok = not (missing or unexplained or explained_success)
    detail = (
        f"{len(results)} terminal; no result: {missing or 'none'}; without a reason: "
        f"{unexplained or 'none'}; succeeded with a reason: {explained_success or 'none'}"
    )
    return Check("terminal_states", ok, detail, {"missing": missing, "no_reason": unexplained})


def one_commit(events: list[dict[str, Any]]) -> Check:
    """No job committed more than one result."""
    committed = Counter(
        str(e.get("job_id")) for e in events if e.get("event") == "job_finished" and e["committed"]
    )
    twice = {j: n for j, n in committed.items() if n > 1}
    return Check("one_result_per_job", not twice, f"jobs committed twice: {twice or 'none'}")


def attempts_never_repeat(events: list[dict[str, Any]]) -> Check:
    """No attempt number of a job started twice, a Redis wipe included (I5)."""
    started: dict[str, Counter[int]] = defaultdict(Counter)
    for e in events:
        if e.get("event") == "job_started":
            started[str(e.get("job_id"))][int(e.get("attempt", 0))] += 1
    repeated = {
        job: sorted(n for n, times in counts.items() if times > 1)
        for job, counts in started.items()
        if any(times > 1 for times in counts.values())
    }
    total = sum(sum(c.values()) for c in started.values())
    detail = f"{total} attempts started over {len(started)} jobs; repeated: {repeated or 'none'}"
    return Check("attempts_never_repeat", not repeated, detail, {"repeated": repeated})


def read_slots(settings: Settings) -> tuple[dict[str, Stamp], dict[str, str], dict[str, str]]:
    """Each stamped slot's stamp, every slot's state as the checks print it ("never
    stamped", "<state>@<generation>"), and the slots whose stamp cannot be read."""
    stamps: dict[str, Stamp] = {}
    states: dict[str, str] = {}
    unreadable: dict[str, str] = {}
    for n in range(settings.slots):
        slot_id = f"S{n}"
        try:
            stamp = read_stamp(settings.slots_dir / slot_id)
        except StampError as exc:
            unreadable[slot_id] = str(exc)
            continue
        if stamp is None:
            states[slot_id] = "never stamped"
            continue
        stamps[slot_id] = stamp
        states[slot_id] = f"{stamp.state}@{stamp.generation}"
    return stamps, states, unreadable


def slot_checks(
    settings: Settings,
    events: list[dict[str, Any]],
    fsync_slots: set[str],
    settled: Check | None = None,
) -> list[Check]:
    """The slot checks on one host, in the report's order (``settled``: the first, when
    the host's own rule differs, as for a host dead for good)."""
    return [
        settled if settled is not None else slots_settled(settings),
        worktrees(settings),
        poisoned_stay_out(settings, events, fsync_slots),
        generations_grow(events, settings),
    ]


def slots_settled(settings: Settings) -> Check:
    """Every slot is idle, or poisoned with a reason; none still leased."""
    stamps, states, bad = read_slots(settings)
    for slot_id, stamp in stamps.items():
        if stamp.state == SlotState.POISONED and stamp.reason:
            states[slot_id] += f" ({stamp.reason})"
        elif stamp.state != SlotState.IDLE:
            bad[slot_id] = f"{stamp.state} by {stamp.job_id} (reason {stamp.reason})"
    return Check("slots_idle_or_poisoned", not bad, f"slots: {states}", {"bad": bad})


def poisoned_stay_out(settings: Settings, events: list[dict[str, Any]], slots: set[str]) -> Check:
    """A slot whose receipt fsync failed is poisoned, says why, and was never leased again."""
    problems = []
    for slot_id in sorted(slots):
        stamp = read_stamp(settings.slots_dir / slot_id)
        if stamp is None or stamp.state != SlotState.POISONED or not stamp.reason:
            problems.append(f"{slot_id} is not poisoned with a reason ({stamp})")
            continue
        later = [
            e
            for e in events
            if e.get("event") == "slot_leased"
            and e.get("slot_id") == slot_id
            and int(e.get("generation", 0)) > stamp.generation
        ]
        if later:
            problems.append(f"{slot_id} leased again after it was poisoned: {later[0]}")
    detail = "; ".join(problems) or f"poisoned and out of the pool: {sorted(slots) or 'none'}"
    return Check("poisoned_slots_stay_out", not problems, detail)


def generations_grow(events: list[dict[str, Any]], settings: Settings) -> Check:
    """Per (host, slot), the leased generations are strictly increasing (I5)."""
    seen: dict[tuple[str, str], list[int]] = defaultdict(list)
    for e in events:
        if e.get("event") == "slot_leased":
            seen[(str(e.get("host")), str(e.get("slot_id")))].append(int(e["generation"]))
    backwards = {
        f"{host}/{slot}": gens
        for (host, slot), gens in seen.items()
        if any(b <= a for a, b in pairwise(gens))
    }
    behind = {}
    for (host, slot), gens in seen.items():
        stamp = read_stamp(settings.slots_dir / slot) if host == settings.host else None
        if stamp is not None and stamp.generation < max(gens):
            behind[slot] = f"stamp {stamp.generation} < leased {max(gens)}"
    ok = not backwards and not behind
    leases = sum(len(g) for g in seen.values())
    detail = f"{leases} leases over {len(seen)} slots; backwards: {backwards or 'none'}"
    return Check("generations_only_grow", ok, detail + f"; stamps behind: {behind or 'none'}")


def final_trees(results: Mapping[str, JobResult], expected: Mapping[str, str]) -> Check:
    """Each succeeded job's final_tree is its steps applied once to its base."""
    wrong = {
        job_id: f"final_tree {results[job_id].final_tree} != expected {tree}"
        for job_id, tree in expected.items()
        if results[job_id].final_tree != tree
    }
    detail = f"{len(expected)} succeeded jobs compared; wrong: {wrong or 'none'}"
    return Check("final_trees", not wrong, detail, {"wrong": wrong})


def replays_refused(replays: Iterable[Any]) -> Check:
    """Every replayed old-envelope apply was refused with 409 (I1).

    The fence's refusals (``STALE_REASONS``) are what the replay is meant to meet.
    A replay aimed at a slot that an fsync failure poisoned meets ``slot_poisoned``
    first: that slot is never recycled, so there is no newer lease to fence, and the
    refusal still keeps the bytes out. It is counted apart so a run shows how many
    replays the fence itself stopped.
    """
    seen = list(replays)
    fenced = [r for r in seen if r.status == 409 and r.error in STALE_REASONS]
    poisoned = [r for r in seen if r.status == 409 and r.error == POISONED_REASON]
    landed = [
        f"{r.key} -> {r.status} {r.error}" for r in seen if r not in fenced and r not in poisoned
    ]
    detail = (
        f"{len(seen)} replays: {len(fenced)} fenced, {len(poisoned)} met a poisoned slot; "
        f"not refused: {landed or 'none'}"
    )
    return Check(
        "replays_refused",
        not landed,
        detail,
        {"fenced": len(fenced), "poisoned": len(poisoned)},
    )


def worktrees(settings: Settings) -> Check:
    """Every repo cache's worktrees are slot work trees of this host, none stale or extra."""
    allowed = {
        str((settings.slots_dir / f"S{n}" / "work").resolve()) for n in range(settings.slots)
    }
    problems: list[str] = []
    listed = 0
    repos = settings.home / "repos"
    for cache in sorted(repos.glob("*.git")) if repos.is_dir() else []:
        proc = run_git("-C", str(cache), "worktree", "list", "--porcelain", timeout=60)
        if proc.returncode != 0:
            problems.append(f"{cache.name}: git worktree list failed: {stderr_of(proc)[:200]}")
            continue
        for block in proc.stdout.decode(errors="replace").strip().split("\n\n"):
            lines = block.splitlines()
            if not lines or "bare" in lines:
                continue
            path = lines[0].removeprefix("worktree ")
            listed += 1
            if str(Path(path).resolve()) not in allowed:
                problems.append(f"{cache.name}: worktree {path} is not a slot's")
            if any(line.startswith("prunable") for line in lines) or not Path(path).is_dir():
                problems.append(f"{cache.name}: worktree {path} is stale")
    detail = f"{listed} worktrees for {settings.slots} slots; problems: {problems or 'none'}"
    return Check("no_leaked_worktrees", not problems, detail, {"problems": problems})


def supervisor(restarts: int, errors: list[str]) -> Check:
    """The tool server came back after every crash."""
    return Check(
        "toolserver_restarts", not errors, f"{restarts} restarts; failures: {errors or 'none'}"
    )


def leaks(found: list[str]) -> Check:
    """No process of the run outlives it (cmdline or environment naming its home)."""
    return Check("no_leaked_processes", not found, f"left running: {found or 'none'}")


def exec_orphans(
    settings: Settings | Sequence[Settings], job_ids: Iterable[str], ran: int
) -> Check:
    """What the planted execs (``exec_orphan``) started was dead before their replies:
    no file an orphan would have written is in any slot's tree (of any host given),
    and none runs now."""
    marks = [f"{ORPHAN_MARK}{job_id}".encode() for job_id in job_ids]
    hosts = [settings] if isinstance(settings, Settings) else list(settings)
    landed = sorted(
        str(path)
        for host in hosts
        for n in range(host.slots)
        for path in (host.slots_dir / f"S{n}" / "work").rglob(f"{ORPHAN_MARK}*")
    )
    alive = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes() if entry.isdigit() else b""
        except OSError:
            continue
        if any(mark in cmdline for mark in marks):
            shown = cmdline.replace(b"\0", b" ").decode(errors="replace")[:160]
            alive.append(f"{entry}: {shown}")
    ok = not landed and not alive
    detail = (
        f"{ran} planted exec(s) ran; files landed: {landed or 'none'}; alive: {alive or 'none'}"
    )
    return Check("exec_orphans", ok, detail, {"ran": ran, "landed": landed, "alive": alive})


def scan_processes(home: Path) -> list[str]:
    """Processes whose command line or environment names ``home`` (ours excluded)."""
    needle = str(home).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        for part in ("cmdline", "environ"):
            try:
                data = Path(f"/proc/{entry}/{part}").read_bytes()
            except OSError:
                continue
            if needle in data:
                try:
                    cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
                except OSError:
                    cmd = b"?"
                found.append(f"{entry}: {cmd.decode(errors='replace')[:160]}")
                break
    return found


def receipts_i2(home: Path, log: Path, env: Mapping[str, str], name: str = "receipts_i2") -> Check:
    """``ops verify --receipts`` with ``home`` as ``$SLOTRUNNER_HOME``: every slot's receipts
    there, rotated and hot, hold I2 within each slot and across them (one ``applied``
    record a key, one job a key), besides the log's own verdict."""
    return ops_tool(
        "verify", log, {**env, "SLOTRUNNER_HOME": str(home)}, name, options=("--receipts",)
    )
