"""Keep a running attempt's slot lease from expiring under it.

The lease is renewed at half-life, from two places: the heartbeat thread (never
waiting for the slot lock, which the tool server holds through a long ``run_tests``)
and the agent loop before each step (waiting briefly: between our own calls the lock
is free, and a lease that expired during a long call must be renewed before the next
call is checked against it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from runner.core.stamp import Stamp, utc_now
from runner.slots.pool import ReleaseRefused, SlotBusy, SlotPool


def renewal_due(stamp: Stamp, now: datetime, ttl_s: float) -> bool:
    """True once less than half of a ``ttl_s`` lease is left."""
    expires = stamp.expires_at()
    return expires is None or expires - now < timedelta(seconds=ttl_s / 2)


class LeaseKeeper:
    def __init__(
        self, slots: SlotPool, ttl_s: float, clock: Callable[[], datetime] = utc_now
    ) -> None:
        self.slots = slots
        self.ttl_s = ttl_s
        self.clock = clock
        self.lost = threading.Event()  # the slot was taken back from this lease
        self._stamp: Stamp | None = None
        self._lock = threading.Lock()

    def hold(self, stamp: Stamp) -> None:
        with self._lock:
            self._stamp = stamp

    def drop(self) -> None:
        with self._lock:
            self._stamp = None

    def renew_if_due(self, lock_timeout_s: float = 0.0) -> None:
        with self._lock:
            stamp = self._stamp
        if stamp is None or stamp.job_id is None:
            return
        if not renewal_due(stamp, self.clock(), self.ttl_s):
            return
        try:
            renewed = self.slots.renew(
                stamp.slot_id,
                stamp.job_id,
                stamp.generation,
                self.ttl_s,
                lock_timeout_s=lock_timeout_s,
            )
        except SlotBusy:
            return  # the next tick tries again
        except ReleaseRefused:
            with self._lock:
                if self._stamp is stamp:
                    self.lost.set()
            return
        with self._lock:
            if self._stamp is stamp:
                self._stamp = renewed
