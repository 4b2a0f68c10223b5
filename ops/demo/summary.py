"""The summary ``slotrunner demo`` prints: one row per job, then counts from the host's log."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def tool_outcomes(log_path: Path, job_ids: set[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    with open(log_path, "rb") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == "tool_result" and record.get("job_id") in job_ids:
                key = record["outcome"]
                if record.get("reason"):
                    key += f" ({record['reason']})"
                counts[key] += 1
    return counts


def summary(
    console: Console,
    log_path: Path,
    ids: list[str],
    results: dict[str, Any],
    fence: str,
    framework: str | None = None,
) -> None:
    states = Counter(r.state for r in results.values())
    states["unfinished"] = len(ids) - len(results)
    table = Table("state", "slot", "gen", "calls", "replayed", "receipts", "final_tree")
    table.add_column("job", no_wrap=True)
    table.columns.insert(0, table.columns.pop())
    if framework is not None:
        table.add_column("framework", no_wrap=True)
        table.columns.insert(1, table.columns.pop())
    shown = [framework] if framework is not None else []
    for job_id in ids:
        r = results.get(job_id)
        if r is None:
            table.add_row(job_id, *shown, "unfinished", "", "", "", "", "", "")
            continue
        table.add_row(
            job_id,
            *shown,
            r.state,
            r.slot_id or "-",
            str(r.generation or "-"),
            str(r.counts.tool_calls),
            str(r.counts.replayed),
            str(r.counts.receipts),
            (r.final_tree or "")[:12],
        )
    console.print(table)
    console.print("jobs by state: " + ", ".join(f"{k} {v}" for k, v in sorted(states.items()) if v))
    outcomes = tool_outcomes(log_path, set(ids))
    console.print(
        "tool calls by outcome: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
    )
    receipts = sum(r.counts.receipts for r in results.values())
    refusals = sum(v for k, v in outcomes.items() if k.startswith("refused"))
    console.print(f"receipts {receipts}, refusals {refusals}")
    console.print(f"replay of job 1's apply with its old envelope: {fence}")
    if framework is not None:
        for job_id in ids:
            r = results.get(job_id)
            if r is not None and r.state != "succeeded":
                console.print(f"{job_id}: {r.state}: {r.reason}", markup=False)
    console.print(f"log: {log_path}")
