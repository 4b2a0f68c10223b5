"""``slotrunner ops verify``: prove I1 and I2 over the event logs and, with
``--receipts``, over every slot's receipts, rotated and hot, within each slot and across
them (ops/detect/verify.py, ops/detect/receipts_audit.py, ops/detect/receipts_pool.py).
Exit 0 holds, 1 violated, 2 unusable input."""

from __future__ import annotations

import click
from rich.table import Table
from rich.text import Text

from ops.detect.detector import Incident, Malformed
from ops.detect.receipts_audit import ReceiptViolation
from ops.detect.verify import Proof
from ops.detect.verify import verify as verify_logs
from ops.render import COLUMNS, console, json_line, row
from runner.core.settings import Settings

_RECEIPT_COLUMNS = ("kind", "slot", "key", "job", "bound to", "where", "first")


@click.command()
@click.argument("paths", nargs=-1)
@click.option(
    "--receipts",
    "with_receipts",
    is_flag=True,
    help="Also check every slot's receipts, archived and hot, under $SLOTRUNNER_HOME/slots"
    " (each slot, and the pool across slots).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def verify(paths: tuple[str, ...], with_receipts: bool, as_json: bool) -> None:
    """Prove I1 (every apply inside its owner's lease) and I2 (every key applied at most
    once) over PATH... (default: this host's log); --receipts adds I2 over every slot's
    receipts (one applied record a key, one job a key, in the whole pool: a key applied
    again or bound to another job in another slot counts too). Exit 0 holds, 1
    violated, 2 unusable input."""
    inputs = list(paths) or [str(Settings.from_env().log_path)]
    shown: list[Incident] = []
    found: list[ReceiptViolation] = []

    def on_item(item: Incident | Malformed) -> None:
        if as_json:
            json_line(item.to_json())
        elif isinstance(item, Incident):
            shown.append(item)

    def on_receipt(item: ReceiptViolation) -> None:
        if as_json:
            json_line(item.to_json())
        else:
            found.append(item)

    slots = Settings.from_env().slots_dir if with_receipts else None
    proof = verify_logs(inputs, on_item, receipts=slots, on_receipt=on_receipt)
    for path, why in proof.unusable.items():
        click.echo(f"error: {path}: {why}", err=True)
    if as_json:
        json_line(proof.to_json())
    else:
        _show(proof, shown, found)
    raise SystemExit(proof.exit_code)


def _show(proof: Proof, shown: list[Incident], found: list[ReceiptViolation]) -> None:
    out = console()
    if shown:
        table = Table(*COLUMNS, title="violations", title_justify="left")
        for incident in shown:
            table.add_row(*row(incident))
        out.print(table)
    if found:
        table = Table(*_RECEIPT_COLUMNS, title="receipt violations", title_justify="left")
        for v in found:
            table.add_row(
                *map(Text, (v.kind, v.slot_id, v.key, v.job_id, v.bound_to, v.where, v.first))
            )
        out.print(table)
    counts = Table("checked", "count", title="verify", title_justify="left")
    for name in ("lines", "malformed", "leases", "releases", "applies", "keys"):
        counts.add_row(name, str(getattr(proof, name)))
    if proof.receipts is not None:
        for name, n in proof.receipts.to_json().items():
            counts.add_row(f"receipt {name}", str(n))
    for kind, n in proof.violations.items():
        counts.add_row(kind, str(n))
    out.print(counts)
    if proof.unusable:
        verdict = "[bold red]INCOMPLETE (unusable input)[/]"
    else:
        verdict = "[green]I1 and I2 hold[/]" if proof.holds else "[bold red]VIOLATED[/]"
    over = f"{proof.applies} applies of {proof.keys} keys"
    if proof.receipts is not None:
        r = proof.receipts
        over += f" and {r.records} receipts ({r.archived} archived) of {r.slots} slots"
    out.print(f"{verdict} over {over}")
