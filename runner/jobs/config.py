"""Timing knobs of job liveness, backpressure and the janitor, read once at the edge.

``runner.core.settings.Settings`` holds what every process of a host shares; these are
the worker's own clocks. ``runner.worker.celery_app.create_app`` reads them from the
environment (the app factory is an edge) and hands the frozen object to every task:

    SLOTRUNNER_HEARTBEAT_TTL_S        5     a running attempt is live while its heartbeat
                                            key exists; a copy takes over this long after
                                            the attempt's last renewal
    SLOTRUNNER_HEARTBEAT_INTERVAL_S   1     how often the attempt renews it (< TTL / 2)
    SLOTRUNNER_SLOT_WAIT_S            30    longest wait for a free slot, then ``rejected``
    SLOTRUNNER_MIN_DEADLINE_S         5     a job with less of its deadline left is not
                                            started: ``rejected`` (reason ``deadline``)
    SLOTRUNNER_JANITOR_INTERVAL_S     5     period of the worker's janitor sweep
    SLOTRUNNER_DELIVERY_RETRY_S       2     first wait before a delivery that failed
                                            outside the job (Redis gone, a stamp or
                                            floor that cannot be written) is retried;
                                            doubles, 5 retries, then the job fails
    SLOTRUNNER_ADMISSION_RECOVERY_HOLD_S    how long an admission desk re-created after
                                            a Redis loss grants nothing (unset: the
                                            planner's HTTP timeout plus 30 s; 0: no hold)

Broker timing (``SLOTRUNNER_VISIBILITY_TIMEOUT_S``) is read by the app factory itself,
because it is kombu's, not ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from runner.core.settings import SettingsError


@dataclass(frozen=True)
class JobConfig:
    heartbeat_ttl_s: float = 5.0
    heartbeat_interval_s: float = 1.0
    slot_wait_s: float = 30.0
    min_deadline_s: float = 5.0
    janitor_interval_s: float = 5.0
    # How often a watchdog copy looks at the live attempt, and a slot waiter retries.
    watchdog_poll_s: float = 0.5
    # None: each planner's own (runner.agent.planners.admission_desk).
    admission_recovery_hold_s: float | None = None
    # A delivery that fails outside the job's own handling is retried this many times,
    # the first after delivery_retry_s (doubling, capped at 60 s), then the job fails.
    delivery_retries: int = 5
    delivery_retry_s: float = 2.0

    def __post_init__(self) -> None:
        if self.heartbeat_interval_s * 2 > self.heartbeat_ttl_s:
            # One missed renewal must not look like a dead attempt.
            raise SettingsError(
                f"SLOTRUNNER_HEARTBEAT_INTERVAL_S={self.heartbeat_interval_s:g} must be at "
                f"most half of SLOTRUNNER_HEARTBEAT_TTL_S={self.heartbeat_ttl_s:g}"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> JobConfig:
        return cls(
            heartbeat_ttl_s=seconds(env, "SLOTRUNNER_HEARTBEAT_TTL_S", cls.heartbeat_ttl_s),
            heartbeat_interval_s=seconds(
                env, "SLOTRUNNER_HEARTBEAT_INTERVAL_S", cls.heartbeat_interval_s
            ),
            slot_wait_s=seconds(env, "SLOTRUNNER_SLOT_WAIT_S", cls.slot_wait_s, zero_ok=True),
            min_deadline_s=seconds(
                env, "SLOTRUNNER_MIN_DEADLINE_S", cls.min_deadline_s, zero_ok=True
            ),
            janitor_interval_s=seconds(
                env, "SLOTRUNNER_JANITOR_INTERVAL_S", cls.janitor_interval_s
            ),
            admission_recovery_hold_s=optional_seconds(env, "SLOTRUNNER_ADMISSION_RECOVERY_HOLD_S"),
            delivery_retry_s=seconds(env, "SLOTRUNNER_DELIVERY_RETRY_S", cls.delivery_retry_s),
        )


def seconds(env: Mapping[str, str], name: str, default: float, *, zero_ok: bool = False) -> float:
    """A duration from the environment, with an error that names the variable."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected a number of seconds") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise SettingsError(f"{name}={raw!r}: expected a finite number of seconds")
    if value < 0 or (value == 0 and not zero_ok):
        raise SettingsError(f"{name}={raw!r}: must be greater than 0")
    return value


def optional_seconds(env: Mapping[str, str], name: str) -> float | None:
    """A duration from the environment that may be 0; None when it is not set."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    return seconds(env, name, 0.0, zero_ok=True)
