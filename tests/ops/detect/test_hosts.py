"""ops detect and ops verify over several hosts' logs at once (docs/architecture.md §Several hosts).

Each host writes its own log; slot ids repeat on every host and generations are
counted per host, so the same ``(slot_id, generation)`` names different jobs on
different hosts. Read together (merged by ``ts``, timelines keyed by host and slot),
the logs must say exactly what each says alone, and a line that claims one host's
slot with another host's generation must be caught wherever it was written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ops.cli import ops
from ops.detect.detector import Incident, Kind, Malformed
from ops.detect.follow import Follower
from ops.testing.synthlog import LogSynth, synth_log
from runner.core import events
from tests.support.detectlog import result_line
from tools.registry import MUTATING_TOOLS

HOSTS = ("hA", "hB", "hC")
Found = tuple[int, set[tuple[Any, ...]], set[tuple[str, int]], dict[str, Any]]


def _run(verb: str, paths: Sequence[Path | str]) -> Found:
    """``ops VERB --json PATHS``: exit code, incidents as (kind, host, slot, gen, job,
    path, line), malformed lines as (path, line), and the summary."""
    result = CliRunner().invoke(ops, [verb, "--json", *map(str, paths)])
    *items, summary = [json.loads(line) for line in result.stdout.splitlines()]
    assert summary["kind"] == "summary", result.output
    incidents = {
        (o["kind"], o["host"], o["slot_id"], o["generation"], o["job_id"], o["path"], o["line"])
        for o in items
        if o["kind"] != "malformed"
    }
    malformed = {(o["path"], o["line"]) for o in items if o["kind"] == "malformed"}
    return result.exit_code, incidents, malformed, summary


def _union(verb: str, paths: Sequence[Path]) -> Found:
    """The per-file runs of ``verb`` put together: the worst exit code, every finding,
    and the summaries' counts added up."""
    runs = [_run(verb, [path]) for path in paths]
    total: dict[str, Any] = {}
    for _, _, _, summary in runs:
        for name, value in summary.items():
            if isinstance(value, dict):
                into = total.setdefault(name, {})
                for k, n in value.items():
                    into[k] = into.get(k, 0) + n
            elif isinstance(value, int) and not isinstance(value, bool):
                total[name] = total.get(name, 0) + value
    return (
        max(code for code, *_ in runs),
        set().union(*(r[1] for r in runs)),
        set().union(*(r[2] for r in runs)),
        total,
    )


def _records(path: Path) -> list[dict[str, Any]]:
    """The lines of a log that are JSON objects (garbage skipped), by a plain json.loads."""
    out = []
    for raw in path.read_bytes().splitlines():
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def _leases(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """(slot_id, generation) -> its slot_leased line, for one host's log."""
    return {
        (r["slot_id"], r["generation"]): r
        for r in _records(path)
        if r.get("event") == events.SLOT_LEASED and "generation" in r
    }


_TS = re.compile(rb'"ts": "([^"]+)"')


def _skew(path: Path, by: timedelta) -> None:
    """Shift every timestamp of one host's log, as that host's clock would."""

    def shifted(m: re.Match[bytes]) -> bytes:
        ts = datetime.fromisoformat(m.group(1).decode()) + by
        return b'"ts": "' + ts.isoformat().replace("+00:00", "Z").encode() + b'"'

    path.write_bytes(_TS.sub(shifted, path.read_bytes()))


# -- read together, the same as each alone ---------------------------------------------


@pytest.mark.parametrize(
    ("seed", "skew_s"),
    [(1, 0.0), (2, -3600.0), (3, 0.0004)],
    ids=["same-clock", "host-C-an-hour-behind", "host-C-jittered"],
)
def test_many_hosts_logs_read_together_report_the_union_of_each_alone(
    tmp_path: Path, seed: int, skew_s: float
) -> None:
    """Three hosts' logs with every incident kind and garbage: detect and verify over
    all three (merged by ts, whatever the hosts' clocks say) report exactly what the
    three per-file runs report, each incident naming its own host, each malformed line
    its own file and line. The logs do hold the confusable case: one slot id and
    generation leased on two hosts to different jobs."""
    synth = synth_log(tmp_path / "log.jsonl", 4_000, per_host=True, seed=seed, hosts=HOSTS)
    paths = [Path(synth.paths[h]) for h in HOSTS]
    _skew(paths[2], timedelta(seconds=skew_s))
    host_of = {str(p): h for h, p in zip(HOSTS, paths, strict=True)}
    leases = [_leases(p) for p in paths]
    shared = set(leases[0]) & set(leases[1])
    assert any(leases[0][k]["job_id"] != leases[1][k]["job_id"] for k in shared)

    code, incidents, malformed, summary = _run("detect", paths)
    ucode, uincidents, umalformed, usummary = _union("detect", paths)
    assert (code, incidents, malformed) == (ucode, uincidents, umalformed)
    assert {(kind, path, line) for kind, *_, path, line in incidents} == synth.expected
    assert malformed == synth.malformed
    assert all(host == host_of[path] for _, host, *_, path, _ in incidents)
    for name in ("lines", "malformed", "incidents"):
        assert summary[name] == usummary[name], name

    code, violations, malformed, proof = _run("verify", paths)
    ucode, uviolations, umalformed, uproof = _union("verify", paths)
    assert (code, violations, malformed) == (ucode, uviolations, umalformed)
    assert (code, violations, malformed) == (1, incidents, synth.malformed)
    for name in ("lines", "malformed", "leases", "releases", "applies", "keys", "violations"):
        assert proof[name] == uproof[name], name


def test_a_log_named_twice_is_read_once(tmp_path: Path) -> None:
    """``hA/*.jsonl hA/log.jsonl`` reads hA's log once: read twice, every apply in it
    would be a false duplicate_apply."""
    synth = synth_log(tmp_path / "log.jsonl", 2_000, per_host=True, seed=4, hosts=HOSTS[:2])
    first, second = (synth.paths[h] for h in HOSTS[:2])
    once = _run("detect", [first, second])
    assert _run("detect", [first, str(tmp_path / "*.jsonl"), second, first]) == once
    assert _run("verify", [first, first])[1:3] == _run("verify", [first])[1:3]


# -- a cross-host confusion, injected ---------------------------------------------------


def _clean_hosts(tmp_path: Path, steps: int, seed: int) -> tuple[LogSynth, list[Path]]:
    """Normal traffic of three hosts, one log each, no incident and no garbage."""
    paths = [tmp_path / f"{h}.jsonl" for h in HOSTS]
    files = {h: open(p, "wb") for h, p in zip(HOSTS, paths, strict=True)}  # noqa: SIM115
    try:
        synth = LogSynth(
            dict(files), {h: str(p) for h, p in zip(HOSTS, paths, strict=True)}, seed=seed
        )
        for _ in range(steps):
            synth.step()
    finally:
        for fh in files.values():
            fh.close()
    return synth, paths


def _confusion(synth: LogSynth, paths: list[Path], variant: str) -> tuple[bytes, Kind, str, int]:
    """A line claiming hA's slot with one of hB's generations, applied by hB's job that
    holds it: (the line, the kind it is on hA's timeline, its slot, its generation)."""
    a_leases, b_leases = _leases(paths[0]), _leases(paths[1])
    for slot in sorted({s for s, _ in b_leases}):
        a_gen = synth.slots[("hA", slot)].generation
        b_gen = synth.slots[("hB", slot)].generation
        gen, kind = {
            # hA leased this generation of the slot too, to another job
            "leased_to_another_job": (a_gen if b_gen >= a_gen else 0, Kind.CROSS_JOB),
            # hA never got this far
            "never_leased_on_a": (b_gen if b_gen > a_gen else 0, Kind.UNOWNED),
            # hA has moved past it
            "behind_a": (min(a_gen - 1, b_gen), Kind.STALE),
        }[variant]
        if gen >= 1:
            break
    else:
        raise AssertionError(f"no slot of these logs fits {variant}")
    theirs = b_leases[(slot, gen)]
    job = str(theirs["job_id"])
    assert a_leases.get((slot, gen), {}).get("job_id") != job
    line = result_line(
        job,
        gen,
        f"{job}:a{theirs['attempt']}:s99:write_file",
        tool="write_file",
        host="hA",
        slot=slot,
        attempt=int(theirs["attempt"]),
        receipt_job=job,
        ts=synth.next_ts(),
    )
    return line, kind, slot, gen


def _with(path: Path, line: bytes, into: Path) -> tuple[Path, int]:
    """A copy of ``path`` at ``into`` with ``line`` appended; the copy and that line's number."""
    data = path.read_bytes() + line + b"\n"
    into.write_bytes(data)
    return into, data.count(b"\n")


@pytest.mark.parametrize("variant", ["leased_to_another_job", "never_leased_on_a", "behind_a"])
def test_a_line_claiming_one_hosts_slot_with_anothers_generation_is_caught(
    tmp_path: Path, variant: str
) -> None:
    """hA's S<n> with a generation hB leased for its own S<n>, applied by hB's job: over
    hA's log, alone or with the others, an incident of the kind hA's timeline gives
    (cross_job_apply when hA leased that generation to another job, unowned_apply when
    hA never got that far, stale_generation_apply when hA has moved past it), naming
    hA; verify fails. The same line written into hB's log is judged by the host it
    claims: alone, hB's log has no lease of hA's slot (unowned_apply, hA); with hA's
    log, the same kind as above."""
    synth, paths = _clean_hosts(tmp_path, 3_000, seed=21)
    assert _run("detect", paths)[0] == _run("verify", paths)[0] == 0
    line, kind, slot, gen = _confusion(synth, paths, variant)
    a_bad, a_line = _with(paths[0], line, tmp_path / "hA-bad.jsonl")
    b_bad, b_line = _with(paths[1], line, tmp_path / "hB-bad.jsonl")
    job = json.loads(line)["job_id"]

    def one(kind: Kind, path: Path, n: int) -> set[tuple[Any, ...]]:
        return {(str(kind), "hA", slot, gen, job, str(path), n)}

    for logs in ([a_bad], [a_bad, paths[1], paths[2]]):
        assert _run("detect", logs)[:2] == (1, one(kind, a_bad, a_line))
        assert _run("verify", logs)[:2] == (1, one(kind, a_bad, a_line))
    assert _run("detect", [b_bad])[:2] == (1, one(Kind.UNOWNED, b_bad, b_line))
    assert _run("verify", [b_bad])[:2] == (1, one(Kind.UNOWNED, b_bad, b_line))
    assert _run("detect", [paths[0], b_bad, paths[2]])[:2] == (1, one(kind, b_bad, b_line))


def test_hBs_own_apply_relabelled_as_hAs_is_also_a_second_apply_of_its_key(tmp_path: Path) -> None:
    """A copy of one of hB's applies that says host hA (a generation hA leased to another
    job): on hA's timeline a cross_job_apply, and, read with hB's log, its key's second
    apply in the pool (duplicate_apply): the key set spans every log read."""
    synth, paths = _clean_hosts(tmp_path, 3_000, seed=21)
    a_leases = _leases(paths[0])
    copy = next(
        r
        for r in _records(paths[1])
        if r.get("outcome") == events.OUTCOME_APPLIED
        and r.get("tool") in MUTATING_TOOLS
        and r["slot_generation"] == synth.slots[("hA", r["slot_id"])].generation
        and (r["slot_id"], r["slot_generation"]) in a_leases
    )
    line = json.dumps({**copy, "host": "hA"}).encode()
    a_bad, n = _with(paths[0], line, tmp_path / "hA-bad.jsonl")
    where = ("hA", copy["slot_id"], copy["slot_generation"], copy["job_id"], str(a_bad), n)
    assert _run("detect", [a_bad])[1] == {(str(Kind.CROSS_JOB), *where)}
    both = {(str(Kind.CROSS_JOB), *where), (str(Kind.DUPLICATE), *where)}
    assert _run("detect", [a_bad, paths[1]])[1] == both
    assert _run("verify", [a_bad, paths[1], paths[2]])[:2] == (1, both)


def test_the_moved_jobs_new_attempt_in_its_old_hosts_slot_violates_i1(tmp_path: Path) -> None:
    """hA's job, moved to hB as attempt n+1, applies into its old slot on hA with that
    slot's generation: the job's own superseded tree, no other job's, so not one of the
    kinds detect pages on; verify counts it (wrong_attempt_apply, naming hA)."""
    synth, paths = _clean_hosts(tmp_path, 3_000, seed=21)
    slot, state = next(
        (s, st) for (h, s), st in sorted(synth.slots.items()) if h == "hA" and st.job is not None
    )
    assert state.job is not None
    attempt = state.attempt + 1
    line = result_line(
        state.job,
        state.generation,
        f"{state.job}:a{attempt}:s0:write_file",
        tool="write_file",
        host="hA",
        slot=slot,
        attempt=attempt,
        receipt_job=state.job,
        ts=synth.next_ts(),
    )
    a_bad, n = _with(paths[0], line, tmp_path / "hA-bad.jsonl")
    logs = [a_bad, paths[1], paths[2]]
    assert _run("detect", logs)[:2] == (0, set())
    found = (str(Kind.WRONG_ATTEMPT), "hA", slot, state.generation, state.job, str(a_bad), n)
    assert _run("verify", logs)[:2] == (1, {found})


# -- following several hosts' logs ------------------------------------------------------


def test_follow_over_every_hosts_log_catches_the_confusion_naming_its_host(
    tmp_path: Path,
) -> None:
    """``ops detect --follow`` takes every host's log: the clean traffic of all three
    is no incident, and a confused line appended to hA's log while followed is one,
    naming hA, at its own file and line."""
    synth, paths = _clean_hosts(tmp_path, 3_000, seed=21)
    seen: list[Incident | Malformed] = []
    follower = Follower([str(p) for p in paths], tmp_path / "state", seen.extend)
    try:
        follower.poll()
        assert seen == [] and follower.lines == 3_000
        line, kind, slot, gen = _confusion(synth, paths, "leased_to_another_job")
        with open(paths[0], "ab") as fh:
            fh.write(line + b"\n")
        follower.poll()
    finally:
        follower.close()
    n = paths[0].read_bytes().count(b"\n")
    incidents = [i for i in seen if isinstance(i, Incident)]
    assert len(incidents) == len(seen)  # no malformed line either
    found = [(i.kind, i.host, i.slot_id, i.generation, i.path, i.line) for i in incidents]
    assert found == [(str(kind), "hA", slot, gen, str(paths[0]), n)]
