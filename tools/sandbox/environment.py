"""A job's built environment as its sandboxed commands see it (docs/architecture.md §Environments).

On disk, under ``$SLOTRUNNER_HOME``, one directory per environment key::

    envs/<key>/env/        the environment itself (a venv, a node_modules, any tree
                           the setup wrote): the only thing ever shown to a job
    envs/<key>/meta.json   written last, durably: the environment is good
    envs/<key>/build.log   every setup command's output, in order
    envs/<key>/failed.json the last build failed (the next job on the key builds again)

``runner.envs`` builds and manages them; this module is what the tool server needs
to show one to ``run_tests`` and ``exec``: the slot's ``job.json`` names the key and
the path the environment was built at (its *mount*), and :func:`environment_of` turns
that into one read-only bind and the variables ``PATH`` and ``VIRTUAL_ENV``. Only a
key of the right shape whose ``meta.json`` exists gives a bind: a record that is not
exactly right gives none, never a wider one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tools.sandbox.policy import DEFAULT_PATH, WORK_PATH, Bind

ENVS_DIR: Final = "envs"
ENV_DIR: Final = "env"
META_FILE: Final = "meta.json"
# Where an environment built in the sandbox lives, in its build and in every later
# command: a venv records its own path, so the two must be the same.
ENV_PATH: Final = str(Path(WORK_PATH).parent / "env")
KEY_PATTERN: Final = re.compile(r"[0-9a-f]{24}")


@dataclass(frozen=True)
class Environment:
    """A built environment shown to a command: where it is and what to set."""

    key: str
    bind: Bind
    variables: dict[str, str]


def env_root(home: Path, key: str) -> Path:
    """``envs/<key>`` under ``home``; the key is checked first."""
    if not KEY_PATTERN.fullmatch(key):
        raise ValueError(f"{key!r} is not an environment key (24 hex digits)")
    return Path(home).resolve() / ENVS_DIR / key


def variables(mount: str) -> dict[str, str]:
    """``$ENV/bin`` first on ``PATH``, ``VIRTUAL_ENV`` the environment."""
    return {"PATH": f"{mount}/bin:{DEFAULT_PATH}", "VIRTUAL_ENV": mount}


def environment_of(home: Path, job: dict[str, Any]) -> Environment | None:
    """The environment a slot's job description names, if it names a good one."""
    record = job.get("environment")
    if not isinstance(record, dict):
        return None
    key, mount = record.get("key"), record.get("mount")
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key) or not isinstance(mount, str):
        return None
    root = env_root(home, key)
    env = root / ENV_DIR
    if mount not in (ENV_PATH, str(env)):  # built in the sandbox, or (sandbox off) in place
        return None
    if not (root / META_FILE).is_file() or not env.is_dir() or env.is_symlink():
        return None
    return Environment(key, Bind(env, mount), variables(mount))
