"""``slotrunner ops receipts``: a slot's whole receipt history, rotated segments first,
then the hot file, filtered by key or job; a directory with no receipts is a clear
error, exit 2 (ops/receipts.py)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from runner.cli.main import main
from tools.receipts.store import ReceiptStore, Status


def history(slot: Path) -> None:
    """Two generations: the first rotated into the archive, the second still hot."""
    store = ReceiptStore(slot)
    for generation, job in ((1, "job-a"), (2, "job-b")):
        for step in range(2):
            began = store.begin(
                key=f"{job}:a1:s{step}:write_file",
                job_id=job,
                attempt=1,
                slot_id="S0",
                generation=generation,
                tool="write_file",
            )
            store.finish(began.receipt, Status.APPLIED)
        if generation == 1:
            assert store.rotate() == 2
    store.close()


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["ops", "receipts", *args])
    return result.exit_code, result.output


def test_every_record_in_written_order_rotated_ones_first(tmp_path: Path) -> None:
    history(tmp_path)
    code, out = run(str(tmp_path), "--json")
    assert code == 0, out
    records = [json.loads(line) for line in out.splitlines()]
    assert [(r["generation"], r["key"], r["status"]) for r in records] == [
        (g, f"{job}:a1:s{step}:write_file", status)
        for g, job in ((1, "job-a"), (2, "job-b"))
        for step in range(2)
        for status in ("intent", "applied")
    ]


def test_filters_by_key_and_by_job(tmp_path: Path) -> None:
    history(tmp_path)
    _, by_key = run(str(tmp_path), "--json", "--key", "job-a:a1:s1:write_file")
    assert [json.loads(line)["status"] for line in by_key.splitlines()] == ["intent", "applied"]
    _, by_job = run(str(tmp_path), "--json", "--job", "job-b")
    assert {json.loads(line)["job_id"] for line in by_job.splitlines()} == {"job-b"}
    code, table = run(str(tmp_path), "--job", "job-a")
    assert code == 0 and "4 records" in table and "job-a:a1:s0:write_file" in table


def test_a_directory_without_receipts_is_named_and_exits_2(tmp_path: Path) -> None:
    code, out = run(str(tmp_path / "nowhere"))
    assert code == 2
    assert "no receipts there" in out and "Traceback" not in out
