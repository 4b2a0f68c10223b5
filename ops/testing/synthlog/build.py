"""Whole synthetic logs: every incident variant for every mutating tool, at known lines."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from ops.testing.synthlog.incidents import GARBAGE, INJECTIONS, inject, write_garbage
from ops.testing.synthlog.traffic import MUTATING, LogSynth


def synth_log(
    path: Path,
    total: int,
    *,
    seed: int = 0,
    rounds: int = 1,
    per_host: bool = False,
    keep_meta: bool = False,
    garbage: bool = True,
    hosts: Sequence[str] = ("h1", "h2"),
) -> LogSynth:
    """A log of ``total`` lines (one file per host when ``per_host``): incidents of every
    variant for every mutating tool ``rounds`` times, the first and last lines among
    them, and (unless not ``garbage``) every kind of garbage line once per round. Every
    host has the same slot ids, its generations counted from 1: they coincide."""
    paths = (
        {h: str(path.with_name(f"{path.stem}-{h}{path.suffix}")) for h in hosts}
        if per_host
        else dict.fromkeys(hosts, str(path))
    )
    opened = {p: open(p, "wb") for p in set(paths.values())}  # noqa: SIM115
    files: dict[str, BinaryIO] = {h: opened[paths[h]] for h in hosts}
    synth = LogSynth(files, paths, seed=seed)
    synth.keep_meta = keep_meta
    try:
        todo: list[tuple[str, str]] = [
            (v, t) for _ in range(rounds) for v in INJECTIONS for t in MUTATING
        ]
        todo += [("garbage", g) for _ in range(rounds if garbage else 0) for g in GARBAGE]
        synth.rng.shuffle(todo)
        slots = sorted(synth.rng.sample(range(2, total - 1), len(todo)))
        inject(synth, "unowned_slot", "write_file")  # the first line
        pending: list[tuple[str, str]] = []
        n = 1
        while n < total - 1:
            while slots and slots[0] <= n:
                slots.pop(0)
                pending.append(todo.pop())
            if pending:
                variant, arg = pending[0]
                if variant == "garbage":
                    write_garbage(synth, arg)
                    pending.pop(0)
                elif inject(synth, variant, arg):
                    pending.pop(0)
                else:
                    synth.step()
            else:
                synth.step()
            n += 1
        assert not pending and not todo, "log too short for its injections"
        while not inject(synth, "cross_job_owner", "apply_patch"):  # the last line
            synth.step()
    finally:
        for fh in opened.values():
            fh.close()
    return synth


def clean_log(path: Path, total: int, seed: int = 0) -> LogSynth:
    """Normal traffic only: no incident, no garbage."""
    with open(path, "wb") as fh:
        synth = LogSynth({"h1": fh, "h2": fh}, {"h1": str(path), "h2": str(path)}, seed=seed)
        for _ in range(total):
            synth.step()
    return synth
