"""The pipeline benchmark's floors and its breakdown of where a call's time goes.

Floors (issue #17): what one durable ``write_file`` cannot go below on this machine
whatever the tool server does, measured as arms of the pipeline benchmark's own run:

- **two-fsync HTTP floor**: the baseline's bare POST to the no-op server, then two
  durable appends of receipt-sized lines, synced as the store syncs its own
  (:func:`append_fsync`: one ``RWF_DSYNC`` write each; the last intent and outcome of the slot's
  own ``receipts.jsonl``): the round trip and the two durable records a mutating
  call makes (intent before the effect, outcome after: docs/architecture.md §Receipts).
- **effect floor**: the same with the effect between the two records, done with the
  system calls ``tools.paths.write.write_bytes`` makes for an existing file and
  nothing around them (:func:`replace_file`). The rename matters: on ext4
  (``auto_da_alloc``) renaming over an existing file flushes the new file's data,
  which costs about an fsync.
- **no-op effect floor** (the issue's own floor for the pipeline): the subject's very
  call, ``ToolClient`` through HTTP to a tool server on the same slot, whose
  ``write_file`` records both receipts but writes nothing
  (``ops.testing.toolserver.NoopEffect``): what the pipeline costs with nothing to
  apply, so the subject against it is what the write itself adds. It is the floor of
  the figure's verdict, taken from the two called in turn (``subject_in_turn``,
  ``noop_effect_in_turn``: ``bench.stats.alternate``); the other two are in its note.

The breakdown is a table of medians (p50 per call) of arms that add one layer at a
time, so a reader sees the HTTP stack, the server's service and the client apart.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.stats import FLOOR_BOUND, Floor, Run, cost_ratio, summarize
from runner.core import durable
from tools.receipts.log import RECEIPTS_FILE

# write_bytes' flags (tools/paths/walk.py, tools/paths/write.py), so the floor's
# opens take the same kernel paths as the tool's.
_O_DIR = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY)
_O_TMP = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

# The breakdown's rows: (arm, what the arm is, what it adds over the row above).
STEPS = (
    ("healthz_noop", "GET /healthz, no-op server", "the HTTP round trip (httpx, uvicorn, FastAPI)"),
    ("healthz", "GET /healthz, tool server", "the tool server's middleware and its reply model"),
    (
        "read_bare",
        "read_file, bare httpx -> tool server",
        "body and envelope checks, slot lock, the read, one log line",
    ),
    (
        "write_bare",
        "write_file, bare httpx -> tool server",
        "2 receipt fsyncs, the pre-digest, the write (temp file + rename)",
    ),
    (
        "subject",
        "write_file, ToolClient -> tool server (the subject)",
        "the client: stamp read and local check, retry wrapper",
    ),
)
REFERENCES = (
    ("baseline", "no-op POST + one fsync (the baseline)"),
    ("floor_two_fsync", "no-op POST + two receipt-sized fsyncs (two-fsync HTTP floor)"),
    ("floor_effect", "the same + the effect's syscalls (effect floor)"),
    ("floor_noop_effect", "the subject's call with a no-op effect (no-op effect floor)"),
    ("service", "ToolService.call in this process (no HTTP, no client, no log line)"),
)


def receipt_lines(slot_dir: Path) -> tuple[bytes, bytes]:
    """The last intent and outcome the slot's store wrote: the floor appends their sizes."""
    lines = (slot_dir / RECEIPTS_FILE).read_bytes().splitlines(keepends=True)
    if len(lines) < 2:
        raise RuntimeError(f"{slot_dir / RECEIPTS_FILE} holds {len(lines)} records, not 2+")
    return lines[-2], lines[-1]


def append_fsync(fd: int, line: bytes) -> None:
    """One durable append as the receipt store makes it (``runner/core/durable.py``): one
    ``RWF_DSYNC`` write where the store's appends are synced by their write, else
    ``write`` + ``fsync``; a floor must not pay for a sync the store does not make."""
    if durable.synced_appends():
        os.pwritev(fd, (line,), -1, os.RWF_DSYNC)
    else:
        os.write(fd, line)
        os.fsync(fd)


def replace_file(work: Path, parent: str, name: str, tmp: str, data: bytes) -> None:
    """``write_bytes(work, f"{parent}/{name}", data)``'s system calls over an existing
    file, none of its checks: the root and the parent opened ``O_PATH``, the target
    lstat'ed (by the walk, then by ``write_at``), the temp file created, written and
    chmod'ed to the target's mode, closed, renamed over the target."""
    root = os.open(work, _O_DIR)
    try:
        os.stat(parent, dir_fd=root, follow_symlinks=False)
        dir_fd = os.open(parent, _O_DIR, dir_fd=root)
        try:
            os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            mode = stat.S_IMODE(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
            fd = os.open(tmp, _O_TMP, 0o666, dir_fd=dir_fd)
            try:
                os.write(fd, data)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        os.close(root)


@dataclass
class DiskFloor:
    """The durable part of one write_file done bare, on an open ``O_APPEND`` file."""

    fd: int
    intent: bytes
    outcome: bytes
    work: Path  # the slot's work tree
    parent: str  # a directory in it holding the targets
    data: bytes
    made: int = 0

    def records(self) -> None:
        append_fsync(self.fd, self.intent)
        append_fsync(self.fd, self.outcome)

    def records_and_effect(self, target: str) -> None:
        self.made += 1
        append_fsync(self.fd, self.intent)
        replace_file(self.work, self.parent, target, f".slotrunner-tmp-{self.made:016x}", self.data)
        append_fsync(self.fd, self.outcome)


def verdict(within: bool) -> str:
    return "yes" if within else "no"


def write_file_floor(runs: Mapping[str, Sequence[Run]]) -> Floor:
    """pipeline.write_file against the floor issue #17 names for it, the same call with a
    no-op effect, paired call by call (``subject_in_turn`` and ``noop_effect_in_turn``);
    in the note against the stricter effect floor, the two-fsync one, and the no-op
    effect floor's own block of calls."""
    value = cost_ratio(runs["floor_noop_effect"], runs["baseline"])[0]
    ratio, low, high = cost_ratio(runs["subject_in_turn"], runs["noop_effect_in_turn"])
    blocks, k_low, k_high = cost_ratio(runs["subject"], runs["floor_noop_effect"])
    effect, e_low, e_high = cost_ratio(runs["subject"], runs["floor_effect"])
    effect_value = cost_ratio(runs["floor_effect"], runs["baseline"])[0]
    bare, b_low, b_high = cost_ratio(runs["subject"], runs["floor_two_fsync"])
    bare_value = cost_ratio(runs["floor_two_fsync"], runs["baseline"])[0]
    return Floor(
        name="pipeline.floor_noop_effect",
        what="the subject's call to a tool server whose write_file writes nothing",
        value=value,
        ratio=ratio,
        ratio_means=(
            "subject time per call / no-op effect call time per call, the two called in "
            "turn (A B, B A, ...) in each repetition"
        ),
        spread=(low, high),
        note=f"the same pair measured as blocks of calls, as the other arms are: "
        f"{blocks:.3g}x (pairs: {k_low:.3g} .. {k_high:.3g}); within {FLOOR_BOUND}x: "
        f"{verdict(blocks <= FLOOR_BOUND)}. Against the effect floor (pipeline.floor_with_effect, "
        f"{effect_value:.3g}x the baseline: the bare POST, the two records and the write's "
        f"system calls, none of the tool server) the subject is at {effect:.3g}x (pairs: "
        f"{e_low:.3g} .. {e_high:.3g}); within {FLOOR_BOUND}x: {verdict(effect <= FLOOR_BOUND)}. "
        f"Against the two-fsync HTTP floor (pipeline.floor_two_fsync, {bare_value:.3g}x "
        f"the baseline, no effect) it is at {bare:.3g}x (pairs: {b_low:.3g} .. "
        f"{b_high:.3g}); within {FLOOR_BOUND}x: {verdict(bare <= FLOOR_BOUND)}",
    )


def breakdown(runs: Mapping[str, Sequence[Run]]) -> str:
    """Where a call's time goes: a Markdown table of p50s, each step over the one above."""
    p50 = {arm: summarize(arm_runs)["p50_ms"] for arm, arm_runs in runs.items()}
    rows = [
        "Where the time goes (p50 per call, ms, all repetitions pooled; each step adds "
        "one layer to the row above, so the differences are medians' differences, "
        "not exact shares):",
        "",
        "| step | p50 ms | over the row above | what the step adds |",
        "|---|---:|---:|---|",
    ]
    above: float | None = None
    for arm, label, adds in STEPS:
        step = "-" if above is None else f"{p50[arm] - above:+.3f}"
        rows.append(f"| {label} | {p50[arm]:.3f} | {step} | {adds} |")
        above = p50[arm]
    rows.append("| *for reference:* | | | |")
    rows += [f"| {label} | {p50[arm]:.3f} | | |" for arm, label in REFERENCES]
    return "\n".join(rows)
