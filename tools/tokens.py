"""Lease tokens: the bearer credential of one slot lease (``docs/architecture.md``
§Lease tokens).

Leasing a slot mints a token bound to ``(host, slot_id, generation, job_id,
attempt)`` and to the job's allowed tools. The slot keeps only the token's sha256, in
``slots/<slot_id>/tokens/<generation>.json`` beside ``work/`` (never inside it, never
in Redis), written durably before the lease's stamp. The token names its slot and
generation in clear (``slr.<slot_id>.<generation>.<secret>``) so the server reads one
record instead of trying every slot; only the secret part authenticates.

A token never decides on its own whether its lease holds: the tool server builds the
envelope from the record's identity and runs the one envelope verdict against the
slot's current stamp, under the slot lock (``tools.server.service``). A released,
recycled, superseded or expired lease therefore refuses every call with the
envelope's own reason. Records of the last :data:`KEEP_RECORDS` generations of a slot
are kept, so an old token is refused with that reason; an older one is unknown (401).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from runner.core.durable import Fsync, ensure_dir, os_fsync, replace_file
from runner.core.stamp import iso, utc_now, valid_slot_id

PREFIX = "slr"
TOKENS_DIR = "tokens"
# The server's MCP endpoint, relative to the tool server's URL (tools.server.mcp).
MCP_PATH = "/mcp"
SECRET_BYTES = 32
# Old records kept per slot: a token of one of these leases is refused with the
# envelope's reason; a token older than that is no longer known at all (401).
KEEP_RECORDS = 64
MAX_TOKEN_CHARS = 256


class TokenRecord(BaseModel):
    """What the slot keeps of a token: its hash and the lease it is bound to."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sha256: str
    host: str
    slot_id: str
    generation: int
    job_id: str
    attempt: int
    # The job's allowed tools, or None for every tool of the registry.
    tools: tuple[str, ...] | None = None
    minted_at: str

    def allows(self, tool: str) -> bool:
        return self.tools is None or tool in self.tools


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def mcp_url(toolserver_url: str) -> str:
    return toolserver_url.rstrip("/") + MCP_PATH


def parse(token: str) -> tuple[str, int] | None:
    """The slot id and generation a token names, or None when it is not shaped like one."""
    if not token or len(token) > MAX_TOKEN_CHARS or not token.startswith(PREFIX + "."):
        return None
    # The secret is url-safe base64 (no '.'); a slot id may contain dots.
    named, _, secret = token[len(PREFIX) + 1 :].rpartition(".")
    slot_id, _, generation = named.rpartition(".")
    if not secret or not valid_slot_id(slot_id) or not generation.isdigit():
        return None
    return slot_id, int(generation)


def record_path(slot_dir: Path, generation: int) -> Path:
    return slot_dir / TOKENS_DIR / f"{generation}.json"


def issue(
    slot_dir: Path,
    *,
    host: str,
    slot_id: str,
    generation: int,
    job_id: str,
    attempt: int,
    tools: Iterable[str] | None,
    fsync: Fsync = os_fsync,
) -> str:
    """Mint the token of a lease about to be stamped; its record is durable on return.

    The caller holds the slot lock and writes the stamp after this: a lease never
    exists without its record, and a record whose stamp was never written names a
    generation the next lease takes again, replacing it.
    """
    token = f"{PREFIX}.{slot_id}.{generation}.{secrets.token_urlsafe(SECRET_BYTES)}"
    record = TokenRecord(
        sha256=digest(token),
        host=host,
        slot_id=slot_id,
        generation=generation,
        job_id=job_id,
        attempt=attempt,
        tools=None if tools is None else tuple(sorted(set(tools))),
        minted_at=iso(utc_now()),
    )
    directory = slot_dir / TOKENS_DIR
    ensure_dir(directory, fsync=fsync)
    replace_file(
        record_path(slot_dir, generation),
        record.model_dump_json(indent=1).encode() + b"\n",
        fsync=fsync,
    )
    _prune(directory, generation)
    return token


def _prune(directory: Path, newest: int) -> None:
    for path in directory.glob("*.json"):
        if path.stem.isdigit() and int(path.stem) <= newest - KEEP_RECORDS:
            with contextlib.suppress(OSError):
                path.unlink()


def read_record(slot_dir: Path, generation: int) -> TokenRecord | None:
    """The record of the lease at ``generation``, None when there is none.

    A record that exists but cannot be read raises :class:`ValueError`: a caller that
    gates a call on it must fail closed.

    Records are read on every MCP request and every call's tool check, and a record
    never changes in place (it is written by rename, and pruned): a record read before
    is answered again while the file's ``stat`` still names the same file and bytes,
    one system call instead of an open, a read and a validation.
    """
    path = record_path(slot_dir, generation)
    where = os.fspath(path)
    try:
        seen = _identity(os.stat(where))
    except FileNotFoundError:
        return None
    cached = _RECORDS.get(where)
    if cached is not None and cached[0] == seen:
        return cached[1]
    try:
        with open(where, "rb") as f:
            # The identity of what is read, not of what was stat'ed: a record replaced
            # in between is cached under its own identity.
            seen, raw = _identity(os.fstat(f.fileno())), f.read()
    except FileNotFoundError:
        return None
    try:
        record = TokenRecord.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        raise ValueError(f"{path} is not a token record") from exc
    if len(_RECORDS) >= _RECORDS_MAX:
        _RECORDS.clear()
    _RECORDS[where] = (seen, record)
    return record


# path -> (identity of the file read, its record): read_record's cache.
_RECORDS: dict[str, tuple[tuple[int, ...], TokenRecord]] = {}
_RECORDS_MAX = 4096


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def authenticate(slots_dir: Path, host: str, token: str) -> TokenRecord | None:
    """The record a token was minted with on this host, or None (unknown or forged).

    Says nothing about whether the lease still holds: that is the envelope verdict's
    question, asked under the slot lock on every call.
    """
    named = parse(token)
    if named is None:
        return None
    slot_id, generation = named
    try:
        record = read_record(slots_dir / slot_id, generation)
    except (OSError, ValueError):
        return None
    if record is None or not hmac.compare_digest(record.sha256, digest(token)):
        return None
    if (record.host, record.slot_id, record.generation) != (host, slot_id, generation):
        return None
    return record
