"""Settings, read once from the environment into one frozen object.

Nothing in slotrunner reads ``os.environ`` for its own configuration anywhere else:
a process builds a :class:`Settings` at its edge (CLI, Celery app factory, server
factory) and passes it down.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from runner.errors import RunnerError

SandboxMode = Literal["required", "auto", "off"]
_SANDBOX_MODES: tuple[SandboxMode, ...] = ("required", "auto", "off")
DEFAULT_GATEWAY_URL = "http://127.0.0.1:8791/v1"
DEFAULT_ENVS_MAX_GB = 20.0


class SettingsError(RunnerError, ValueError):
    """An environment variable has a value slotrunner cannot use."""


@dataclass(frozen=True)
class Settings:
    home: Path
    redis_url: str | None
    slots: int
    toolserver_url: str
    lease_ttl_s: float
    token: str | None
    sandbox: SandboxMode
    host: str
    # The admission gateway's API base, as agents are given it (runner/gateway/).
    gateway_url: str = DEFAULT_GATEWAY_URL
    # Disk the host's built environments may take before the least recently used go
    # (runner/envs/).
    envs_max_gb: float = DEFAULT_ENVS_MAX_GB

    @property
    def slots_dir(self) -> Path:
        return self.home / "slots"

    @property
    def repos_dir(self) -> Path:
        return self.home / "repos"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def log_path(self) -> Path:
        return self.logs_dir / "slotrunner.jsonl"

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    def to_env(self) -> dict[str, str]:
        """The environment variables that make a child process build these same settings.

        The inverse of :meth:`from_env`: ``Settings.from_env(s.to_env()) == s``. Every
        variable is set, an unset value as ``""`` (which :meth:`from_env` reads as unset),
        so nothing inherited from the parent's environment can change a child's view.
        """
        return {
            "SLOTRUNNER_HOME": str(self.home),
            "REDIS_URL": self.redis_url or "",
            "SLOTRUNNER_SLOTS": str(self.slots),
            "SLOTRUNNER_TOOLSERVER_URL": self.toolserver_url,
            "SLOTRUNNER_LEASE_TTL_S": repr(self.lease_ttl_s),
            "SLOTRUNNER_TOKEN": self.token or "",
            "SLOTRUNNER_SANDBOX": self.sandbox,
            "SLOTRUNNER_HOST_ID": self.host,
            "SLOTRUNNER_GATEWAY_URL": self.gateway_url,
            "SLOTRUNNER_ENVS_MAX_GB": repr(self.envs_max_gb),
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        home = Path(env.get("SLOTRUNNER_HOME", "./.slotrunner")).expanduser().absolute()
        sandbox: str = env.get("SLOTRUNNER_SANDBOX", "auto").strip().lower()
        if sandbox not in _SANDBOX_MODES:
            raise SettingsError(
                f"SLOTRUNNER_SANDBOX={sandbox!r}: expected one of {', '.join(_SANDBOX_MODES)}"
            )
        return cls(
            home=home,
            redis_url=env.get("REDIS_URL") or None,
            slots=_positive_int(env, "SLOTRUNNER_SLOTS", 4),
            toolserver_url=env.get("SLOTRUNNER_TOOLSERVER_URL", "http://127.0.0.1:8765").rstrip(
                "/"
            ),
            lease_ttl_s=_positive_float(env, "SLOTRUNNER_LEASE_TTL_S", 600.0),
            token=env.get("SLOTRUNNER_TOKEN") or None,
            sandbox=sandbox,
            host=env.get("SLOTRUNNER_HOST_ID") or socket.gethostname(),
            gateway_url=(env.get("SLOTRUNNER_GATEWAY_URL") or DEFAULT_GATEWAY_URL).rstrip("/"),
            envs_max_gb=_positive_float(
                env, "SLOTRUNNER_ENVS_MAX_GB", DEFAULT_ENVS_MAX_GB, unit="a number of GB"
            ),
        )


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected a whole number") from None
    if value < 1:
        raise SettingsError(f"{name}={raw!r}: must be at least 1")
    return value


def _positive_float(
    env: Mapping[str, str], name: str, default: float, unit: str = "a number of seconds"
) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected {unit}") from None
    if not value > 0:
        raise SettingsError(f"{name}={raw!r}: must be greater than 0")
    return value
