"""The checks of a campaign on several hosts: one host's checks joined, and the host faults'.

Slot ids repeat on every host and generations are per host (docs/architecture.md
§Several hosts), so the slot checks run host by host on each one's own stamps and
log, and :func:`joined` makes one check of them. The log-wide checks run over every
host's log at once (``ops verify|detect`` merge them by time); :func:`logs_agree`
holds the merged verdicts to the sum of each log's alone. What only the host faults
can break:

* :func:`dead_host_slots` -- a host killed for good keeps its leases open (nothing
  of it runs to reclaim them); each must belong to a job that ended elsewhere;
* :func:`restarts_settle_first` -- a host that came back reclaimed every lease its
  dead processes left open (their receipts resolved from the tree) before leasing
  that slot again;
* :func:`frozen_never_commit` -- an attempt whose host was frozen while another host
  took its job over never committed a result.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ops.testing.chaos import checks
from ops.testing.chaos.checks import Check
from ops.testing.chaos.faults import Injector
from ops.testing.chaos.hostfaults import Frozen
from ops.testing.chaos.stack import DEAD, ChaosHost, ChaosStack
from runner.core import events as ev
from runner.core.settings import Settings
from runner.core.stamp import SlotState
from runner.jobs.models import JobResult

_SLOT_EVENTS = (ev.SLOT_LEASED, ev.SLOT_RECLAIMED, ev.SLOT_POISONED)


def joined(name: str, per_host: Mapping[str, Check]) -> Check:
    """One check that passes when every host's does; the detail names each host."""
    ok = all(c.ok for c in per_host.values())
    detail = "; ".join(f"{host}: {c.detail}" for host, c in per_host.items())
    return Check(name, ok, detail, {host: c.data for host, c in per_host.items()})


def dead_host_slots(settings: Settings, results: Mapping[str, JobResult]) -> Check:
    """On a host dead for good: every slot is idle, poisoned, or leased by a job that
    has its result (committed by another host)."""
    stamps, states, bad = checks.read_slots(settings)
    for slot_id, stamp in stamps.items():
        if stamp.state in (SlotState.IDLE, SlotState.POISONED):
            continue
        states[slot_id] += f" by {stamp.job_id} (host dead)"
        if stamp.job_id not in results:
            bad[slot_id] = f"{stamp.state} by {stamp.job_id}, which has no result"
    return Check("slots_idle_or_poisoned", not bad, f"dead host, slots: {states}", {"bad": bad})


def restarts_settle_first(hosts: Sequence[ChaosHost]) -> Check:
    """After each restart, every lease open at the kill was reclaimed (or poisoned)
    before its slot was leased again, and none is open at the end."""
    problems: list[str] = []
    reclaimed = resolved = 0
    for host in hosts:
        log = host.log.poll()
        for (_, open_leases), back in zip(host.killed_at, host.restarted_at, strict=False):
            after = log[back:]
            for slot_id, generation in sorted(open_leases.items()):
                first = next(
                    (
                        e
                        for e in after
                        if e.get("event") in _SLOT_EVENTS and e.get("slot_id") == slot_id
                    ),
                    None,
                )
                if first is None:
                    problems.append(f"{host.name}/{slot_id}@{generation}: never settled")
                elif first["event"] == ev.SLOT_LEASED:
                    problems.append(f"{host.name}/{slot_id}@{generation}: leased before settled")
                else:
                    reclaimed += 1
            resolved += sum(
                1
                for e in after
                if e.get("event") == ev.RECEIPT_RESOLVED and e.get("slot_id") in open_leases
            )
    restarted = sum(len(h.restarted_at) for h in hosts)
    detail = (
        f"{restarted} restarts; {reclaimed} leases left open by the dead settled first "
        f"({resolved} receipts resolved from the tree); problems: {problems or 'none'}"
    )
    data = {"restarts": restarted, "settled": reclaimed, "resolved": resolved, "problems": problems}
    return Check("restarts_settle_first", not problems, detail, data)


def frozen_never_commit(events: Sequence[dict[str, Any]], freezes: Sequence[Frozen]) -> Check:
    """A frozen host's attempt that another host took over never committed."""
    committed = {
        (e.get("job_id"), e.get("attempt"), e.get("host"))
        for e in events
        if e.get("event") == ev.JOB_FINISHED and e.get("committed")
    }
    over = [f for f in freezes if f.taken_over_by is not None]
    late = [
        f"{f.job_id} attempt {f.attempt} on {f.host}"
        for f in over
        if (f.job_id, f.attempt, f.host) in committed
    ]
    detail = (
        f"{len(freezes)} freezes, {len(over)} taken over elsewhere; "
        f"a frozen attempt committed: {late or 'none'}"
    )
    data = {"freezes": len(freezes), "taken_over": len(over), "committed": late}
    return Check("frozen_attempts_never_commit", not late, detail, data)


def logs_agree(merged: Check, alone: Sequence[Check]) -> Check:
    """``ops verify|detect`` over every log at once read the lines and applies each log
    alone has (summed), and find every incident each alone finds: as many of each
    kind or more (more only where hosts meet, such as one key applied on two hosts)."""
    name = f"{merged.name}_logs_agree"

    def totals(checks: Sequence[Check]) -> dict[str, Any]:
        counts: Counter[str] = Counter()
        for check in checks:
            counts.update(check.data.get("counts", {}))
        return {
            "lines": sum(int(c.data.get("lines") or 0) for c in checks),
            "applies": sum(int(c.data.get("applies") or 0) for c in checks),
            "counts": {k: v for k, v in counts.items()},
        }

    together, summed = totals([merged]), totals(alone)
    fewer = {k: v for k, v in summed["counts"].items() if together["counts"].get(k, 0) < v}
    ok = (
        together["lines"] == summed["lines"]
        and together["applies"] == summed["applies"]
        and not fewer
        and int(merged.data.get("exit_code", 2))
        >= max((int(c.data.get("exit_code", 2)) for c in alone), default=0)
    )
    shown = ", ".join(f"{k} {v}" for k, v in together["counts"].items() if v) or "no incident"
    detail = f"all logs at once: {together['lines']} lines, {together['applies']} applies, {shown}"
    same = together == summed
    detail += "; each alone, summed: " + ("the same" if same else str(summed))
    return Check(name, ok, detail, {"together": together, "alone": summed})


def host_checks(
    stack: ChaosStack,
    injector: Injector,
    results: Mapping[str, JobResult],
    events: list[dict[str, Any]],
    verify: checks.Check,
    detect: checks.Check,
    env: Mapping[str, str],
) -> list[checks.Check]:
    """The slot checks host by host, joined; then each log alone through ``ops verify``
    and ``ops detect``, their agreement with all logs at once, and the host faults'."""
    per: dict[str, dict[str, checks.Check]] = {}
    for host in stack.hosts:
        own = host.log.poll()
        slots = {slot for name, slot in injector.fsync_slots if name == host.name}
        settled = (
            dead_host_slots(host.settings, results)
            if host.state == DEAD
            else checks.slots_settled(host.settings)
        )
        for check in checks.slot_checks(host.settings, own, slots, settled):
            per.setdefault(check.name, {})[host.name] = check
    alone = {
        which: [
            checks.ops_tool(which, h.settings.log_path, env, f"ops_{which}@{h.name}")
            for h in stack.hosts
        ]
        for which in ("verify", "detect")
    }
    return [
        *(joined(name, by_host) for name, by_host in per.items()),
        *alone["verify"],
        *alone["detect"],
        logs_agree(verify, alone["verify"]),
        logs_agree(detect, alone["detect"]),
        restarts_settle_first(stack.hosts),
        frozen_never_commit(events, injector.host_faults.freezes),
    ]


def host_row(host: ChaosHost, injector: Injector) -> dict[str, Any]:
    """What one host did, for the report's table of hosts."""
    log = host.log.poll()
    hit = Counter(f.kind for f in injector.fired if f.host == host.name and not f.skipped)
    return {
        "host": host.name,
        "home": str(host.home),
        "state": host.state,
        "attempts_started": sum(1 for e in log if e.get("event") == "job_started"),
        "results_committed": sum(
            1 for e in log if e.get("event") == "job_finished" and e.get("committed")
        ),
        "leases": sum(1 for e in log if e.get("event") == "slot_leased"),
        "faults": dict(hit),
        "toolserver_restarts": len(host.restarts),
        "worker_restarts": len(host.worker_restarts),
    }
