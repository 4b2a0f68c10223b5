"""Run the chaos campaign over a range of seeds and write ``bench/CHAOS.md``.

    python -m bench.chaos_sweep --seeds 1-20 --jobs 30 --out-dir DIR
    python -m bench.chaos_sweep --seeds 1-10 --jobs 30 --hosts 3 --out-dir DIR
    python -m bench.chaos_sweep --seeds 1-20 --out-dir DIR --report-only

Each seed runs as its own ``slotrunner chaos`` process (exactly the README's loop),
its report kept under ``DIR/<seed>/``. The tables of ``CHAOS.md`` are rebuilt from
those reports; everything from its ``## Findings`` heading on is prose written by
hand, and is kept as it is. A sweep on one host rewrites the top of the file; a
sweep with ``--hosts N`` rewrites only its ``## Several hosts`` section (between the
top and the Findings), so the two sweeps' tables live side by side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from ops.detect.detector import DETECT_KINDS as DETECT_KIND_LIST
from ops.detect.detector import Kind
from ops.testing.chaos.plan import ALL_KINDS, KINDS

CHAOS_MD = Path(__file__).with_name("CHAOS.md")
FINDINGS = "## Findings"
HOSTS = "## Several hosts"
STATES = ("succeeded", "failed", "cancelled", "rejected")
# What `ops verify` and `ops detect` report, as they name it.
VERIFY_KINDS = tuple(str(k) for k in Kind)
DETECT_KINDS = tuple(str(k) for k in DETECT_KIND_LIST)
CHECKS_TEXT = """## What each run checks

`ops_verify` and `ops_detect` (the operator's `slotrunner ops verify|detect --json`
over the run's `logs/slotrunner.jsonl`: zero cross-job, stale-generation, unowned and
duplicate applies), `terminal_states` (every job ends succeeded/failed/rejected/
cancelled, and every end but success carries a reason), `one_result_per_job`,
`attempts_never_repeat` (no attempt number of a job starts twice, across a Redis
wipe too), `slots_idle_or_poisoned` (after a bounded janitor sweep),
`no_leaked_worktrees` (every repo cache's worktrees are this host's slot trees),
`poisoned_slots_stay_out` (a slot whose receipt fsync failed is poisoned with a
reason and never leased again), `generations_only_grow` (per host and slot, leased
generations strictly increase), `final_trees` (every succeeded job's `final_tree`
equals its steps applied once to its base in a plain clone, computed in-process),
`replays_refused` (every replayed old envelope got 409: from the fence, or from a
slot an fsync failure poisoned), `toolserver_restarts` and `no_leaked_processes`
(nothing in /proc names the run's scratch home once the stack is stopped). The
denominator is duplicate applies per 100 injected faults."""
HOSTS_CHECKS_TEXT = """### What each run checks on several hosts

The checks above, over every host: `ops_verify` and `ops_detect` over all the hosts'
logs at once (merged by time, timelines keyed by host and slot) and over each alone
(`ops_verify@h1` ...), and `*_logs_agree` (all at once read every line and apply each
alone does and find every incident each alone finds); the slot checks host by host
on each host's own stamps and log (generations are per host, slot ids repeat); a host
killed for good may keep leases open only for jobs that ended elsewhere;
`attempts_never_repeat` per job across hosts; `no_leaked_processes` over every home.
Then what only the host faults can break: `restarts_settle_first` (a host that came
back reclaimed every lease its dead processes left open, resolving their receipts
from the tree, before leasing that slot again) and `frozen_attempts_never_commit` (an
attempt whose host was frozen while another host took the job over never committed).
`host_kill` SIGKILLs every process of a host at once, mid-call (its tool server dies
after the call's effect, before the outcome); `host_restart` starts it again on its
home some seconds later, or the host stays dead; `host_freeze` SIGSTOPs a whole host
until another host started a newer attempt of the job; one host is up at every
moment."""


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise click.BadParameter(f"{part!r}: expected N or N-M")
        seeds += range(int(low), int(high or low) + 1)
    return seeds


def run_seed(
    seed: int, jobs: int, out_dir: Path, hosts: int = 1, faults: str | None = None
) -> dict[str, Any]:
    """One ``slotrunner chaos`` run; its exit code and wall time."""
    env = {**os.environ, "SLOTRUNNER_HOME": str(out_dir / "home")}
    argv = [
        sys.executable,
        "-m",
        "runner.cli.main",
        "chaos",
        "--seed",
        str(seed),
        "--jobs",
        str(jobs),
    ]
    argv += ["--hosts", str(hosts)] if hosts > 1 else []
    argv += ["--faults", faults] if faults else []
    argv += ["--report-dir", str(out_dir / str(seed)), "--quiet"]
    started = time.monotonic()
    with open(out_dir / f"{seed}.out", "wb") as log:
        proc = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    return {"seed": seed, "exit": proc.returncode, "wall_s": round(time.monotonic() - started)}


def load_report(out_dir: Path, seed: int) -> dict[str, Any] | None:
    try:
        data = json.loads((out_dir / str(seed) / "report.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _counts(report: dict[str, Any], check: str) -> Counter[str]:
    for item in report.get("checks", []):
        if item.get("name") == check:
            return Counter({k: int(v) for k, v in item.get("data", {}).get("counts", {}).items()})
    return Counter()


def render(
    runs: list[dict[str, Any]],
    out_dir: Path,
    jobs: int,
    started: str,
    hosts: int = 1,
    faults: str | None = None,
) -> str:
    """The tables of a sweep: the whole top of CHAOS.md on one host, the Several hosts
    section (one heading level down) on several."""
    reports = {r["seed"]: load_report(out_dir, r["seed"]) for r in runs}
    kinds = KINDS if hosts == 1 else ALL_KINDS
    if faults:
        kinds = tuple(k for k in kinds if k in faults.split(","))
    h2 = "##" if hosts == 1 else "###"
    done = [rep for rep in reports.values() if rep is not None]
    passing = sum(1 for rep in done if rep.get("ok"))
    injected: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    states: Counter[str] = Counter()
    verify: Counter[str] = Counter()
    detect: Counter[str] = Counter()
    for rep in done:
        for fired in rep.get("fired", []):
            (skipped if fired.get("skipped") else injected)[str(fired["kind"])] += 1
        states.update(rep.get("states", {}))
        verify.update(_counts(rep, "ops_verify"))
        detect.update(_counts(rep, "ops_detect"))
    duplicates = sum(int(rep.get("duplicate_applies", 0)) for rep in done)
    n_faults = sum(injected.values())
    per_100 = round(100.0 * duplicates / n_faults, 3) if n_faults else 0.0
    wall = sum(int(r["wall_s"]) for r in runs)
    seeds = [r["seed"] for r in runs]
    span = f"{min(seeds)}..{max(seeds)}" if seeds else "none"
    extra = (f" --hosts {hosts}" if hosts > 1 else "") + (f" --faults {faults}" if faults else "")
    if hosts == 1:
        head = [
            f"# slotrunner chaos campaign: seeds {span}, {jobs} jobs each",
            "",
            "A sibling of `RESULTS.md`: the fault campaign of `slotrunner chaos` "
            "(`ops/testing/chaos/campaign.py`)",
            "run on this machine, one seed after the other. Counts, not speeds: the figures per",
            "seed are there to show what ran, not to be compared across machines.",
        ]
        machine = "2 Celery workers x 2 processes, 4 slots"
    else:
        head = [
            f"{HOSTS}: seeds {span}, {jobs} jobs each, {hosts} hosts",
            "",
            f"The same campaign on {hosts} hosts sharing one Redis "
            f"(`slotrunner chaos --hosts {hosts}`):",
            "each host its own home, slots, tool server, proxy and worker; any host's worker",
            "takes any job; whole hosts are killed, restarted and frozen.",
        ]
        machine = f"{hosts} hosts, each 1 Celery worker x 2 processes and 4 slots"
    lines = [
        *head,
        "",
        f"- command: `python -m bench.chaos_sweep --seeds {span.replace('..', '-')} "
        f"--jobs {jobs}{extra} --out-dir DIR` (one `slotrunner chaos --seed S --jobs {jobs}"
        f"{extra}` a seed)",
        f"- date (UTC): {started}",
        f"- machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {machine}, "
        "bwrap sandbox (auto)",
        f"- wall time of the whole sweep: {wall} s ({wall / 60:.1f} min); "
        f"{sum(int(rep.get('jobs', 0)) for rep in done)} jobs, {n_faults} faults injected",
        "",
        f"{h2} Verdict",
        "",
        f"- seeds passing every check: **{passing} of {len(runs)}**",
        f"- duplicate applies: **{duplicates}** ({per_100:g} per 100 injected faults)",
        "- `ops verify` violations, summed over all seeds: "
        + ", ".join(f"{k} {verify[k]}" for k in VERIFY_KINDS),
        "- `ops detect` incidents, summed over all seeds: "
        + ", ".join(f"{k} {detect[k]}" for k in DETECT_KINDS),
        "",
        f"{h2} Faults injected, by kind (all seeds)",
        "",
        "| kind | injected | planned but not injected |",
        "|---|---:|---:|",
        *(f"| {k} | {injected[k]} | {skipped[k]} |" for k in kinds),
        f"| **total** | **{n_faults}** | **{sum(skipped.values())}** |",
        "",
        "A planned fault is *not injected* when its moment never came or would have been",
        "moot: the job failed before reaching that step, no redelivered copy arrived while",
        "the slow tests ran (every worker process was busy), another worker was already",
        "paused, or the armed crash's call never reached its effect. Each report's `fired`",
        "list says which and why.",
        "",
        f"{h2} Jobs by terminal state (all seeds)",
        "",
        "| state | jobs |",
        "|---|---:|",
        *(f"| {s} | {states[s]} |" for s in STATES),
        f"| **total** | **{sum(states.values())}** |",
        "",
        f"{h2} Per seed",
        "",
        "| seed | verdict | jobs | faults | not injected | "
        + " | ".join(STATES)
        + " | dup applies | tool server restarts | worker restarts | duration s | jobs/s "
        "| exit | wall s |",
        "|---:|---|" + "---:|" * 14,
    ]
    for run in runs:
        found = reports[run["seed"]]
        if found is None:
            lines.append(f"| {run['seed']} | no report | " + "| " * 13 + f"{run['exit']} | ")
            continue
        rep = found
        row = [
            str(run["seed"]),
            "pass" if rep.get("ok") else "**FAIL**",
            str(rep.get("jobs")),
            str(rep.get("faults_injected")),
            str(rep.get("faults_skipped")),
            *(str(rep.get("states", {}).get(s, 0)) for s in STATES),
            str(rep.get("duplicate_applies")),
            str(rep.get("toolserver_restarts")),
            str(len(rep.get("worker_restarts", []))),
            f"{float(rep.get('duration_s', 0)):.1f}",
            f"{float(rep.get('jobs_per_s', 0)):.2f}",
            str(run["exit"]),
            str(run["wall_s"]),
        ]
        lines.append("| " + " | ".join(row) + " |")
    failed = [
        f"- seed {seed}: " + ", ".join(c["name"] for c in r.get("checks", []) if not c["ok"])
        for seed, r in reports.items()
        if r is not None and not r.get("ok")
    ]
    if failed:
        lines += ["", "Failed checks:", "", *failed]
    if hosts > 1:
        lines += ["", *_per_host(done, h2), "", HOSTS_CHECKS_TEXT]
    else:
        lines += ["", CHECKS_TEXT]
    return "\n".join(lines) + "\n"


def _per_host(done: list[dict[str, Any]], h2: str) -> list[str]:
    """A row per host name, summed over the seeds' reports."""
    rows: dict[str, Counter[str]] = {}
    for rep in done:
        for row in rep.get("hosts", []):
            into = rows.setdefault(str(row["host"]), Counter())
            into["dead at the end"] += row.get("state") == "dead"
            for key in ("attempts_started", "results_committed", "leases"):
                into[key] += int(row.get(key, 0))
            for kind in ("host_kill", "host_restart", "host_freeze"):
                into[kind] += int(row.get("faults", {}).get(kind, 0))
    cols = [
        "attempts_started",
        "results_committed",
        "leases",
        "host_kill",
        "host_restart",
        "host_freeze",
        "dead at the end",
    ]
    return [
        f"{h2} Per host (all seeds)",
        "",
        "| host | " + " | ".join(c.replace("_", " ") for c in cols) + " |",
        "|---|" + "---:|" * len(cols),
        *(
            f"| {name} | " + " | ".join(str(row[c]) for c in cols) + " |"
            for name, row in sorted(rows.items())
        ),
    ]


def keep_findings(text: str) -> str:
    """The hand-written part of the current CHAOS.md, from its Findings heading on."""
    at = text.find(FINDINGS)
    return text[at:] if at >= 0 else f"{FINDINGS}\n\n(none written yet)\n"


def split(text: str) -> tuple[str, str, str]:
    """CHAOS.md as (one host's tables, the Several hosts section, the Findings on)."""
    findings = keep_findings(text)
    body = text[: text.find(FINDINGS)] if FINDINGS in text else text
    at = body.find(f"\n{HOSTS}")

    def tidy(part: str) -> str:
        return part.rstrip("\n") + "\n" if part.strip() else ""

    if at < 0:
        return tidy(body), "", findings
    return tidy(body[:at]), tidy(body[at + 1 :]), findings


def compose(current: str, tables: str, hosts: int) -> str:
    """``current`` with the sweep's ``tables`` in their place (the top on one host, the
    Several hosts section on several); everything else kept."""
    top, section, findings = split(current)
    if hosts == 1:
        top = tables
    else:
        section = tables
    return "\n".join(part for part in (top, section, findings) if part)


@click.command()
@click.option("--seeds", "seeds_text", default="1-20", show_default=True, help="N, N-M, ...")
@click.option("--jobs", type=click.IntRange(1, 500), default=30, show_default=True)
@click.option(
    "--hosts",
    type=click.IntRange(1, 8),
    default=1,
    show_default=True,
    help="Hosts of each run (`slotrunner chaos --hosts`); 2 or more fill the "
    "Several hosts section.",
)
@click.option("--faults", metavar="KIND,...", help="Only these fault kinds (`chaos --faults`).")
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Where each seed's report and scratch home go.",
)
@click.option("--report-only", is_flag=True, help="Do not run: rebuild from DIR's reports.")
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=CHAOS_MD,
    show_default=True,
)
def main(
    seeds_text: str,
    jobs: int,
    hosts: int,
    faults: str | None,
    out_dir: Path,
    report_only: bool,
    output: Path,
) -> None:
    """Run seeds of `slotrunner chaos` one after the other and write CHAOS.md."""
    seeds = parse_seeds(seeds_text)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs_file = out_dir / "runs.json"
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if report_only:
        saved = json.loads(runs_file.read_text()) if runs_file.exists() else {}
        runs = saved.get("runs") or [{"seed": s, "exit": "?", "wall_s": 0} for s in seeds]
        started = saved.get("started", started)
    else:
        runs = []
        for seed in seeds:
            run = run_seed(seed, jobs, out_dir, hosts, faults)
            runs.append(run)
            runs_file.write_text(json.dumps({"started": started, "runs": runs}))
            click.echo(f"seed {seed}: exit {run['exit']} in {run['wall_s']} s", err=True)
    current = output.read_text() if output.exists() else ""
    tables = render(runs, out_dir, jobs, started, hosts, faults)
    output.write_text(compose(current, tables, hosts))
    click.echo(f"wrote {output}", err=True)


if __name__ == "__main__":
    main()
