"""The whole-host faults as the injector runs them: kill, freeze and restart a host.

Each is a hook rule on every host's proxy (``ops.testing.chaos.faults``); the host hit
is the one whose worker made the call. Before a host goes down the stack's gate
(:meth:`ops.testing.chaos.stack.ChaosStack.take_down`) must see another host up,
waiting up to :data:`GATE_WAIT_S` for one (a frozen host thawing, a killed one
restarting); otherwise the fault is recorded as not injected.

* ``host_kill``: the host's tool server is armed to SIGKILL itself right after the
  call's effect, before its outcome (when no other crash is armed there), the call
  goes on, and as soon as it answered -- or died -- every process of the host is
  SIGKILLed at once. The slot stamps then show which leases the dead attempts left
  open. Each ``host_restart`` planned for that kill is started on a timer.
* ``host_restart``: ``after_s`` seconds after the kill (at once when every job
  finished first) the host starts again on its home and port.
* ``host_freeze``: the host is SIGSTOPped whole while the call waits in the proxy,
  until another host started a newer attempt of the job (polled, bounded by
  :data:`FREEZE_MAX_S`), then SIGCONTed; the call then goes on, to be refused or to
  land in the frozen attempt's own slot.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from ops.testing.chaos import kinds as cp
from ops.testing.chaos.stack import DEAD, FROZEN, UP, ChaosHost, ChaosStack, wait_until
from ops.testing.fault_proxy import Call, Rule
from ops.testing.stack import StackError
from runner.core import events

GATE_WAIT_S = 30.0
FREEZE_MAX_S = 45.0


@dataclass(frozen=True)
class Frozen:
    """One host freeze: whose attempt was caught, and which attempt took over."""

    host: str
    job_id: str
    attempt: int
    taken_over_by: int | None  # None: no newer attempt came within FREEZE_MAX_S
    held_s: float


class Records(Protocol):
    """What the host faults need of the injector (``ops.testing.chaos.faults.Injector``)."""

    plan: cp.Plan
    stack: ChaosStack
    all_finished: threading.Event

    @property
    def fired(self) -> list[Any]: ...

    def record(self, fault: cp.FaultPlan, **fields: Any) -> Any: ...

    def note(self, fault: cp.FaultPlan, detail: str, *, skipped: bool = False) -> None: ...

    def crash_preempted(self, host: ChaosHost, *, ours: bool) -> None: ...


class HostFaults:
    def __init__(self, injector: Records) -> None:
        self.inj = injector
        self.stack = injector.stack
        self.freezes: list[Frozen] = []
        self._killing: dict[int, tuple[ChaosHost, bool]] = {}  # fault id -> (host, armed)
        self._threads: list[threading.Thread] = []

    def rule(self, fault: cp.FaultPlan, where: dict[str, Any]) -> Rule:
        if fault.kind == cp.HOST_KILL:
            before, after = partial(self._kill_before, fault), partial(self._kill_after, fault)
            return Rule("hook", before=before, after=after, **where)
        return Rule("hook", before=partial(self._freeze, fault), **where)

    def _caller_host(self, fault: cp.FaultPlan, call: Call) -> ChaosHost | None:
        host = self.stack.host_of(call.caller_pid)
        if host is None:
            self.inj.note(fault, f"caller pid {call.caller_pid} is no host's worker", skipped=True)
        return host

    def _down(self, fault: cp.FaultPlan, host: ChaosHost, state: str) -> bool:
        if self.stack.take_down(host, state, GATE_WAIT_S):
            return True
        why = "it was down already" if host.state != UP else "no other host was up"
        self.inj.note(fault, f"{host.name} not taken down: {why}", skipped=True)
        return False

    # -- kill ---------------------------------------------------------------------------

    def _kill_before(self, fault: cp.FaultPlan, call: Call) -> None:
        host = self._caller_host(fault, call)
        if host is None or not self._down(fault, host, DEAD):
            return
        armed = not host.faults.crash_armed()
        if armed:
            host.faults.arm_crash(key_contains=call.key)
        self._killing[fault.fault_id] = (host, armed)

    def _kill_after(self, fault: cp.FaultPlan, call: Call, status: int) -> None:
        taken = self._killing.pop(fault.fault_id, None)
        if taken is None:
            return
        host, armed = taken
        groups, strays = host.kill()
        if host.faults.crash_armed():
            host.faults.disarm_crash()
            self.inj.crash_preempted(host, ours=armed)
        how = (
            "its tool server died after the effect, before the outcome"
            if status == 0
            else f"the call answered {status} first"
        )
        _, open_leases = host.killed_at[-1]
        self.inj.note(
            fault,
            f"{host.name} killed whole ({groups} process groups, {strays} other processes): "
            f"{how}; "
            f"leases left open: {open_leases or 'none'}",
        )
        for restart in self.inj.plan.faults:
            if restart.kind == cp.HOST_RESTART and restart.params.get("kill") == fault.fault_id:
                thread = threading.Thread(
                    target=self._restart, args=(restart, host), name=f"restart-{host.name}"
                )
                self._threads.append(thread)
                thread.start()

    def _restart(self, fault: cp.FaultPlan, host: ChaosHost) -> None:
        down = time.monotonic()
        self.inj.all_finished.wait(float(fault.params.get("after_s", 5)))
        try:
            self.stack.restart(host)
        except StackError as exc:
            self.inj.record(fault, host=host.name, detail=f"failed: {exc}"[:400], skipped=True)
            return
        after = time.monotonic() - down
        self.inj.record(
            fault,
            host=host.name,
            detail=f"{host.name} back on its home {after:.1f}s after it was killed",
        )

    # -- freeze -----------------------------------------------------------------------

    def _freeze(self, fault: cp.FaultPlan, call: Call) -> None:
        host = self._caller_host(fault, call)
        if host is None or not self._down(fault, host, FROZEN):
            return
        job_id, attempt = str(call.envelope.get("job_id")), int(call.envelope.get("attempt", 0))
        held = time.monotonic()

        def elsewhere() -> list[dict[str, Any]]:
            found = self.stack.find(events.JOB_STARTED, job_id=job_id)
            return [e for e in found if e.get("host") != host.name]

        # Any attempt started on another host from now on took the job over (told by
        # its record, not by its number: after a Redis wipe a number may come again).
        # The log tails keep their records, so a record's id names it.
        seen = {id(e) for e in elsewhere()}
        strays = host.freeze()
        try:
            took = wait_until(lambda: [e for e in elsewhere() if id(e) not in seen], FREEZE_MAX_S)
        finally:
            host.thaw(strays)
            self.stack.bring_up(host)
        held_s = time.monotonic() - held
        over = int(took[0].get("attempt", 0)) if took else None
        self.freezes.append(Frozen(host.name, job_id, attempt, over, held_s))
        how = (
            f"attempt {over} took the job over on {took[0].get('host')}"
            if took
            else "no takeover came"
        )
        self.inj.note(fault, f"{host.name} stopped whole {held_s:.1f}s: {how}")

    # -- end of the run -----------------------------------------------------------------

    def settle(self, give_up: float) -> None:
        """Join the restarts (every job finished: they start at once), and say which
        restarts never came because their kill never did."""
        for thread in self._threads:
            thread.join(timeout=max(0.1, give_up - time.monotonic()))
        started = {f.fault_id for f in self.inj.fired if f.kind == cp.HOST_RESTART}
        for fault in self.inj.plan.faults:
            if fault.kind == cp.HOST_RESTART and fault.fault_id not in started:
                self.inj.note(fault, "its host_kill never killed a host", skipped=True)
