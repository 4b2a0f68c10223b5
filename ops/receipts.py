"""``slotrunner ops receipts``: every receipt a slot holds, rotated or hot, for audit.

A lease rotates a slot's settled receipts out of ``receipts.jsonl`` into
``receipts.archive/`` (``tools/receipts/archive.py``): a gzipped segment per rotation
and a key index. This verb reads them back in the order they were written, the
archive's segments first and then the hot file, so an operator (or a script, with
``--json``) sees what a slot applied over its whole life without zcat or sqlite.
It only reads: no lock is held longer than a record's read, nothing is written.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from runner.cli.errors import CliError
from runner.core.settings import Settings
from tools.errors import ToolError
from tools.receipts.archive import ARCHIVE_DIR
from tools.receipts.store import RECEIPTS_FILE, ReceiptStore

_COLUMNS = ("ts", "gen", "job", "attempt", "tool", "status", "key")


def slot_dir_of(slot: str) -> Path:
    """A slot directory given as a path, or a slot id of this host's home."""
    given = Path(slot)
    found = given if given.is_dir() else Settings.from_env().slots_dir / slot
    if not (found / RECEIPTS_FILE).exists() and not (found / ARCHIVE_DIR).is_dir():
        raise CliError(f"{slot}: no receipts there (not a slot directory, nor a slot id)")
    return found


@click.command(name="receipts")
@click.argument("slot")
@click.option("--key", help="Only the records of this idempotency key.")
@click.option("--job", "job_id", help="Only the records of this job.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def receipts(slot: str, key: str | None, job_id: str | None, as_json: bool) -> None:
    """Every receipt of SLOT (a slot directory, or a slot id of $SLOTRUNNER_HOME), the
    rotated ones first, in the order they were written. Exit 0, or 2 when SLOT holds
    no receipts or they cannot be read."""
    store = ReceiptStore(slot_dir_of(slot))
    table = Table(*_COLUMNS, title=f"receipts of {slot}", title_justify="left")
    shown = 0
    try:
        for record in store.records():
            if (key is not None and record.key != key) or (
                job_id is not None and record.job_id != job_id
            ):
                continue
            shown += 1
            if as_json:
                click.echo(json.dumps(record.to_wire()))
            else:
                table.add_row(
                    record.ts,
                    str(record.generation),
                    record.job_id,
                    str(record.attempt),
                    record.tool,
                    record.status.value,
                    record.key,
                )
    except (OSError, ToolError) as exc:
        raise CliError(f"{slot}: the receipts cannot be read: {exc}") from exc
    finally:
        store.close()
    if not as_json:
        console = Console(highlight=False)
        if not console.is_terminal:  # a pipe or a file: keep whole keys on one line
            console = Console(highlight=False, width=220)
        console.print(table)
        console.print(f"{shown} records")
