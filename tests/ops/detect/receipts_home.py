"""What the ``ops verify --receipts`` tests share: a home with slot dirs, records
written through a slot's own store (or past it, as a foreign writer), and the CLI run
with its JSON summary."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from ops.cli import ops
from tools.receipts.format import Receipt, encode_line
from tools.receipts.store import RECEIPTS_FILE, ReceiptStore, Status


def make_home(tmp_path: Path, slots: tuple[str, ...] = ("S0", "S1")) -> Path:
    """A home with an empty event log (verify's default input) and empty slot dirs."""
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)
    (home / "logs" / "slotrunner.jsonl").write_bytes(b"")
    for slot_id in slots:
        (home / "slots" / slot_id).mkdir(parents=True)
    return home


def began(store: ReceiptStore, key: str, job_id: str, generation: int) -> Receipt:
    """A fresh intent of ``key`` in the store's slot."""
    slot_id = store.path.parent.name
    began = store.begin(
        key=key, job_id=job_id, attempt=1, slot_id=slot_id, generation=generation, tool="write_file"
    )
    assert began.fresh
    return began.receipt


def applied(store: ReceiptStore, key: str, job_id: str, generation: int) -> Receipt:
    return store.finish(began(store, key, job_id, generation), Status.APPLIED, digest="d")


def plant(slot: Path, record: Receipt) -> None:
    """A foreign writer's line: appended past the store (its API never writes one)."""
    with open(slot / RECEIPTS_FILE, "ab") as f:
        f.write(encode_line(record))


def run(home: Path, *args: str) -> Result:
    return CliRunner().invoke(ops, ["verify", *args], env={"SLOTRUNNER_HOME": str(home)})


def summary(result: Result) -> dict[str, object]:
    last = json.loads(result.stdout.splitlines()[-1])
    assert last["kind"] == "summary"
    return dict(last)
