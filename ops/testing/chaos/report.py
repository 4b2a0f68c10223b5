"""The chaos campaign's report: one JSON document and a short table, both reproducible.

The seed and the plan come first (the same seed gives the same plan), then what was
injected (by kind, with job, step and time), the jobs by terminal state, every
check, and the denominator: duplicate applies per 100 injected faults, which must
be 0. A campaign on several hosts adds ``hosts``: a row per host (its state at the
end, attempts started, results committed, leases, the faults that hit it).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ops.testing.chaos.checks import Check

REPORT_JSON = "report.json"
REPORT_TXT = "report.txt"


@dataclass
class ChaosReport:
    seed: int
    jobs: int
    workers: int
    kinds: list[str]
    planned: list[dict[str, Any]]
    fired: list[dict[str, Any]]
    states: dict[str, int]
    checks: list[Check]
    duplicate_applies: int
    duration_s: float
    report_dir: str
    toolserver_restarts: int = 0
    worker_restarts: list[str] = field(default_factory=list)  # "<name>: <why it died>"
    notes: list[str] = field(default_factory=list)
    hosts: list[dict[str, Any]] = field(default_factory=list)  # empty on one host

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def injected(self) -> list[dict[str, Any]]:
        return [f for f in self.fired if not f.get("skipped")]

    @property
    def faults_by_kind(self) -> dict[str, int]:
        counts = Counter(str(f["kind"]) for f in self.injected)
        return {kind: counts[kind] for kind in self.kinds if counts[kind]}

    @property
    def duplicates_per_100_faults(self) -> float:
        faults = len(self.injected)
        return round(100.0 * self.duplicate_applies / faults, 3) if faults else 0.0

    @property
    def jobs_per_s(self) -> float:
        return round(self.jobs / self.duration_s, 3) if self.duration_s > 0 else 0.0

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def to_json(self) -> dict[str, Any]:
        hosts = {"hosts": self.hosts} if self.hosts else {}
        return {
            "seed": self.seed,
            "ok": self.ok,
            "jobs": self.jobs,
            "workers": self.workers,
            "kinds": self.kinds,
            "faults_injected": len(self.injected),
            "faults_by_kind": self.faults_by_kind,
            "faults_skipped": len(self.fired) - len(self.injected),
            "duplicate_applies": self.duplicate_applies,
            "duplicates_per_100_faults": self.duplicates_per_100_faults,
            "states": self.states,
            "checks": [c.to_json() for c in self.checks],
            "duration_s": round(self.duration_s, 2),
            "jobs_per_s": self.jobs_per_s,
            "toolserver_restarts": self.toolserver_restarts,
            "worker_restarts": self.worker_restarts,
            "planned": self.planned,
            "fired": sorted(self.fired, key=lambda f: float(f["at_s"])),
            "notes": self.notes,
            "report_dir": self.report_dir,
            **hosts,
        }


def render(report: ChaosReport, console: Console) -> None:
    verdict = "[green]PASS[/]" if report.ok else "[bold red]FAIL[/]"
    on = f" on {len(report.hosts)} hosts" if report.hosts else ""
    console.print(
        f"chaos seed {report.seed}{on}: {verdict}  {report.jobs} jobs, {len(report.injected)} "
        f"faults injected, {report.duplicate_applies} duplicate applies "
        f"({report.duplicates_per_100_faults:g} per 100 faults), {report.duration_s:.1f}s "
        f"({report.jobs_per_s:g} jobs/s)"
    )
    faults = Table("kind", "injected", "where (job/step@s)", title="faults", title_justify="left")
    for kind in report.kinds:
        hits = [f for f in report.injected if f["kind"] == kind]
        where = ", ".join(f"{f['job_id']}/{f['step']}@{f['at_s']:.0f}" for f in hits[:4])
        faults.add_row(kind, str(len(hits)), Text(where + (" ..." if len(hits) > 4 else "")))
    console.print(faults)
    states = ", ".join(f"{state} {n}" for state, n in sorted(report.states.items()))
    console.print(f"jobs by terminal state: {states or 'none'}")
    checks = Table("check", "result", "detail", title="checks", title_justify="left")
    for check in report.checks:
        mark = "[green]ok[/]" if check.ok else "[bold red]FAILED[/]"
        checks.add_row(check.name, mark, Text(check.detail[:300]))
    console.print(checks)
    if report.hosts:
        hosts = Table(
            "host",
            "state",
            "attempts",
            "committed",
            "leases",
            "faults",
            "restarts",
            title="hosts",
            title_justify="left",
        )
        for row in report.hosts:
            hit = ", ".join(f"{k} {n}" for k, n in sorted(row["faults"].items()))
            restarts = f"tool server {row['toolserver_restarts']}, workers {row['worker_restarts']}"
            hosts.add_row(
                row["host"],
                row["state"],
                str(row["attempts_started"]),
                str(row["results_committed"]),
                str(row["leases"]),
                hit or "none",
                restarts,
            )
        console.print(hosts)
    for note in report.notes:
        console.print(Text(f"note: {note}"))


def write_report(report: ChaosReport, directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    as_json = directory / REPORT_JSON
    as_json.write_text(json.dumps(report.to_json(), indent=1, default=str) + "\n")
    as_text = directory / REPORT_TXT
    with open(as_text, "w") as handle:
        render(report, Console(file=handle, width=160, highlight=False, no_color=True))
    return as_json, as_text
