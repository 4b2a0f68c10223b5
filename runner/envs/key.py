"""What names an environment: its key, from the repository, the base and the setup.

An environment is reused by every job whose key is the same (docs/architecture.md
§Environments). The key is the sha256, cut to 24 hex digits, of the canonical JSON of:

- the source repository's cache key (``runner.workspace.source``: one per source);
- the base commit's tree id, or, with ``key_files``, each listed file's blob id at the
  base (so a base whose lock file did not change reuses the environment of the last);
- the setup commands as written, and whether they may reach the network;
- where it is built: ``sandbox`` (at ``/slot/env``) or ``host`` (in its own
  directory, the sandbox off): a venv records its path, so one is no use to the other.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.core.git import run_git, stderr_of
from runner.envs.store import EnvError

KEY_VERSION = 1
_GIT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class EnvKey:
    key: str
    material: dict[str, Any]


def _rev(mirror: Path, name: str) -> str | None:
    proc = run_git(
        "--git-dir", str(mirror), "rev-parse", "--verify", "-q", name, timeout=_GIT_TIMEOUT_S
    )
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def base_inputs(mirror: Path, commit: str, key_files: list[str] | None) -> dict[str, Any]:
    """The base's part of the key: its tree id, or the listed files' blob ids."""
    if key_files is None:
        tree = _rev(mirror, f"{commit}^{{tree}}")
        if tree is None:
            raise EnvError(f"environment: the base commit {commit} has no tree")
        return {"tree": tree}
    blobs: dict[str, str] = {}
    for name in key_files:
        proc = run_git(
            "--git-dir", str(mirror), "cat-file", "-t", f"{commit}:{name}", timeout=_GIT_TIMEOUT_S
        )
        kind = proc.stdout.decode().strip()
        if proc.returncode != 0 or kind != "blob":
            what = f"is a {kind}" if proc.returncode == 0 else f"is not there ({stderr_of(proc)})"
            raise EnvError(
                f"environment.key_files: {name!r} {what} in the base commit {commit[:12]}; "
                "list files of the repository (a lock file, pyproject.toml)"
            )
        blob = _rev(mirror, f"{commit}:{name}")
        assert blob is not None  # cat-file just said it is a blob
        blobs[name] = blob
    return {"files": blobs}


def environment_key(
    source_key: str, base: dict[str, Any], setup: list[list[str]], network: bool, where: str
) -> EnvKey:
    """The key of the environment these inputs build (module docstring)."""
    material = {
        "v": KEY_VERSION,
        "source": source_key,
        "base": base,
        "setup": setup,
        "network": network,
        "where": where,
    }
    text = json.dumps(material, sort_keys=True, separators=(",", ":"))
    return EnvKey(hashlib.sha256(text.encode()).hexdigest()[:24], material)
