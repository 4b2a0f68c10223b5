"""The chaos campaign's hands: turn each planned fault into the real thing, and log it.

Faults bound to a tool call are :class:`ops.testing.fault_proxy.Rule` s matching that job's
step (``kill_*``, ``http_429``, ``lose_response``) or hooks run by the proxy when the
step's call passes through it:

* ``storm_429`` arms a rule that answers the next N calls of *any* job with 429;
* ``server_crash`` arms a crash for the call's key in the stack's fault plan
  (``ops.testing.faultplan``, read only by the stack's own tool server): the tool
  server SIGKILLs itself after that call's effect, before its outcome; the stack's
  supervisor restarts it;
* ``pause`` SIGSTOPs the caller's whole worker until the job's slot was reclaimed
  from the paused attempt (polled, bounded), then SIGCONTs it and lets the call go
  on (to be refused as stale);
* ``cancel_storm`` cancels the job several times while the call is in flight;
* ``fsync_eio`` arms EIO on every fsync in the call's slot, for exactly that call;
* ``redis_wipe`` restarts the stack's Redis with no data while the call waits: writes
  are paused first so the campaign can collect every result already committed (a
  commit in flight blocks, then meets the empty server and is fenced), the server is
  SIGKILLed, its AOF deleted, and it comes back on the same port; the campaign then
  resubmits every job without a result, since the queue, specs and results are gone.

``replay_stale`` runs after its job finished: the step's recorded request is POSTed
straight to the tool server with its old envelope and a fresh key, once the slot was
leased again (the buffered apply of docs/architecture.md §Problem).
``slow_redelivery`` is a job whose tests outlive the broker's visibility timeout; it
fired when the log shows a watchdog copy. ``exec_orphan`` is a step of its job
(``ops.testing.chaos.plan``): it fired when the log shows that exec applied;
``checks.exec_orphans`` judges what it left behind.

On several hosts every rule is on every host's proxy (one job may run anywhere); a
fault acts on the host whose worker made the call (its tool server, its fault plan,
its slots). The whole-host kinds are ``ops.testing.chaos.hostfaults``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from ops.testing.chaos import plan as cp
from ops.testing.chaos.hostfaults import GATE_WAIT_S, HostFaults
from ops.testing.chaos.kinds import Fired
from ops.testing.chaos.replay import Replayed, replay_step
from ops.testing.chaos.stack import ChaosHost, ChaosStack, wait_until
from ops.testing.fault_proxy import Call, Fault, Rule
from runner.jobs.cancel import cancel
from tools import registry

PAUSE_MAX_S = 45.0  # a paused worker is resumed after this even without a takeover
WIPE_PAUSE_MS = 10_000  # writes are held this long at most while results are collected
# Not a rule of the proxy: met after the job (replay_stale), read from the log
# (slow_redelivery), or a step of the job itself (exec_orphan); a restart follows its kill.
_NOT_ARMED = (cp.SLOW_REDELIVERY, cp.REPLAY_STALE, cp.EXEC_ORPHAN, cp.HOST_RESTART)
_RULE_FAULT: dict[str, Fault] = {
    cp.KILL_BEFORE_SEND: "kill_before_send",
    cp.KILL_BEFORE_REPLY: "kill_before_reply",
    cp.KILL_AFTER_REPLY: "kill_after_reply",
    cp.HTTP_429: "status_429",
    cp.LOSE_RESPONSE: "lose_response",
}


class Injector:
    def __init__(self, plan: cp.Plan, stack: ChaosStack, started: float) -> None:
        self.plan = plan
        self.stack = stack
        self.started = started  # monotonic
        self.started_wall = time.time() - (time.monotonic() - started)
        self.fired: list[Fired] = []
        self.replays: list[Replayed] = []
        # (host, slot) whose receipt fsync was made to fail
        self.fsync_slots: set[tuple[str, str]] = set()
        self.all_finished = threading.Event()
        # Set by the campaign: runs the restart it is given between collecting the
        # committed results and resubmitting the jobs that have none.
        self.on_wipe: Callable[[Callable[[], None]], None] = lambda restart: restart()
        self.wipes = 0
        self._by_rule: dict[int, cp.FaultPlan] = {}
        self._lock = threading.Lock()
        self._pausing = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._armed: dict[str, Fired] = {}  # host -> the fault whose crash is armed there
        self._fsync_host: dict[int, ChaosHost] = {}
        self.host_faults = HostFaults(self)
        for host in stack.hosts:
            host.proxy.on_fire = self._on_fire

    def job_id(self, fault: cp.FaultPlan) -> str:
        return self.plan.jobs[fault.job].job_id

    # -- arming -------------------------------------------------------------------

    def arm(self) -> None:
        for fault in self.plan.faults:
            if fault.step < 0 or fault.kind in _NOT_ARMED:
                continue
            rule = self._rule(fault)
            self._by_rule[id(rule)] = fault
            self.stack.add_rule(rule)

    def _rule(self, f: cp.FaultPlan) -> Rule:
        spec = registry.get(f.tool)
        key = f":s{f.step}:" if spec is not None and spec.mutating else None
        where: dict[str, Any] = {
            "path_prefix": f"/v1/tools/{f.tool}",
            "envelope": {"job_id": self.job_id(f), "tool": f.tool},
            "key_contains": key,
        }
        if f.kind in (cp.HOST_KILL, cp.HOST_FREEZE):
            return self.host_faults.rule(f, where)
        if f.kind in _RULE_FAULT:
            times = int(f.params.get("times", 1))
            retry_after_s = int(f.params.get("retry_after_s", 1))
            return Rule(_RULE_FAULT[f.kind], times=times, retry_after_s=retry_after_s, **where)
        hooks = {
            cp.STORM_429: self._storm,
            cp.SERVER_CRASH: self._crash,
            cp.PAUSE: self._pause,
            cp.CANCEL_STORM: self._cancel_call,
            cp.FSYNC_EIO: self._fsync_on,
            cp.REDIS_WIPE: self._wipe,
        }
        after = partial(self._fsync_off, f) if f.kind == cp.FSYNC_EIO else None
        return Rule("hook", before=partial(hooks[f.kind], f), after=after, **where)

    # -- records --------------------------------------------------------------------

    def _now_s(self) -> float:
        return round(time.monotonic() - self.started, 3)

    def _on_fire(self, rule: Rule, call: Call) -> None:
        fault = self._by_rule.get(id(rule))
        if fault is None or (rule.fired > 1):
            return  # a storm's own 429s, or a repeat of a multi-shot rule
        attempt = call.envelope.get("attempt")
        host = self.stack.host_of(call.caller_pid) if len(self.stack.hosts) > 1 else None
        self.record(
            fault,
            attempt=attempt if isinstance(attempt, int) else None,
            host=host.name if host is not None else None,
        )

    def _host(self, fault: cp.FaultPlan, call: Call) -> ChaosHost | None:
        """The host whose worker made ``call`` (one host: that one); None, noted, when
        the caller is no host's worker child."""
        if len(self.stack.hosts) == 1:
            return self.stack.hosts[0]
        host = self.stack.host_of(call.caller_pid)
        if host is None:
            self.note(fault, f"caller pid {call.caller_pid} is no host's worker", skipped=True)
        return host

    def _fired(self, fault: cp.FaultPlan) -> Fired | None:
        with self._lock:
            return next((f for f in self.fired if f.fault_id == fault.fault_id), None)

    def record(self, fault: cp.FaultPlan, **fields: Any) -> Fired:
        with self._lock:
            fired = Fired(
                fault.fault_id,
                fault.kind,
                self.job_id(fault),
                fault.step,
                fault.tool,
                self._now_s(),
                **fields,
            )
            self.fired.append(fired)
            return fired

    def note(self, fault: cp.FaultPlan, detail: str, *, skipped: bool = False) -> None:
        with self._lock:
            for fired in self.fired:
                if fired.fault_id == fault.fault_id:
                    fired.detail = "; ".join(filter(None, [fired.detail, detail]))
                    fired.skipped = fired.skipped or skipped
                    return
        self.record(fault, detail=detail, skipped=skipped)

    # -- hooks run by the proxy -------------------------------------------------------

    def _storm(self, fault: cp.FaultPlan, call: Call) -> None:
        times = int(fault.params["times"])
        self.stack.add_rule(Rule("status_429", "/v1/tools/", times=times, retry_after_s=1))
        self.note(fault, f"the next {times} tool calls of any job answered 429")

    def _crash(self, fault: cp.FaultPlan, call: Call) -> None:
        host = self._host(fault, call)
        if host is None:
            return
        if host.faults.crash_armed():
            self.note(fault, "another crash was still armed", skipped=True)
            return
        host.faults.arm_crash(key_contains=call.key)
        self.note(fault, f"armed for {call.key}")
        fired = self._fired(fault)
        if fired is not None:
            self._armed[host.name] = fired

    def crash_preempted(self, host: ChaosHost, *, ours: bool) -> None:
        """A crash armed on ``host`` was removed unfired (the host was killed first)."""
        fired = self._armed.pop(host.name, None)
        if fired is not None and not ours:
            fired.skipped = True
            fired.detail += "; its host was killed before the call reached its effect"

    def _pause(self, fault: cp.FaultPlan, call: Call) -> None:
        pid = call.caller_pid
        host = self._host(fault, call)
        if host is None:
            return
        group = host.worker_group(pid) if pid is not None else None
        if group is None:
            self.note(fault, f"caller pid {pid} is not a worker child", skipped=True)
            return
        if not self._pausing.acquire(blocking=False):
            self.note(fault, "another worker was paused already", skipped=True)
            return
        # On several hosts, only while another worker serves (the stack's gate).
        several = len(self.stack.hosts) > 1
        if several and not self.stack.hold_worker(host, group, GATE_WAIT_S):
            self._pausing.release()
            self.note(fault, "no other worker was serving", skipped=True)
            return
        job_id, attempt = call.envelope.get("job_id"), call.envelope.get("attempt")
        took = None
        paused = time.monotonic()
        started = len(self.stack.find("job_started", job_id=job_id))
        try:
            os.killpg(group, signal.SIGSTOP)
            over = partial(self._paused_over, host, job_id, attempt, started)
            took = wait_until(over, PAUSE_MAX_S)
        except ProcessLookupError:
            pass  # the worker is gone (killed by another fault): nothing to pause
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGCONT)
            if several:
                self.stack.release_worker(host, group)
            self._pausing.release()
        held = time.monotonic() - paused
        how = "its slot was reclaimed" if took else "no takeover came"
        self.note(fault, f"worker group {group} stopped {held:.1f}s: {how}")

    def _paused_over(self, host: ChaosHost, job_id: Any, attempt: Any, started: int) -> bool:
        """The paused attempt's slot was reclaimed; on several hosts, or another attempt
        started (anywhere: the host's janitor may be the paused worker's own) since
        ``started`` attempts had."""
        if host.log.find("slot_reclaimed", job_id=job_id, attempt=attempt):
            return True
        several = len(self.stack.hosts) > 1
        return several and len(self.stack.find("job_started", job_id=job_id)) > started

    def _cancel_call(self, fault: cp.FaultPlan, call: Call) -> None:
        self.cancel_storm(fault)

    def cancel_storm(self, fault: cp.FaultPlan) -> None:
        outcomes = [
            cancel(self.stack.redis, self.job_id(fault)).outcome.value
            for _ in range(int(fault.params.get("repeats", 2)))
        ]
        self.note(fault, "cancel -> " + ", ".join(outcomes))

    @staticmethod
    def _slot_dir(host: ChaosHost, call: Call) -> Path:
        return host.settings.slots_dir / str(call.envelope.get("slot_id"))

    def _fsync_on(self, fault: cp.FaultPlan, call: Call) -> None:
        host = self._host(fault, call)
        if host is None:
            return
        self._fsync_host[fault.fault_id] = host
        host.faults.arm_fsync_eio(self._slot_dir(host, call))
        self.fsync_slots.add((host.name, str(call.envelope.get("slot_id"))))
        self.note(fault, f"every fsync in slot {call.envelope.get('slot_id')} fails")

    def _fsync_off(self, fault: cp.FaultPlan, call: Call, status: int) -> None:
        host = self._fsync_host.pop(fault.fault_id, None)
        if host is None:
            return
        host.faults.disarm_fsync_eio(self._slot_dir(host, call))
        self.note(fault, f"the server answered {status}")

    def _wipe(self, fault: cp.FaultPlan, call: Call) -> None:
        # A WRITE pause still serves reads: the results committed so far are read in
        # full, and a commit racing the wipe waits, then runs on the empty server.
        self.stack.redis.client_pause(WIPE_PAUSE_MS, all=False)
        seen: dict[str, float] = {}

        def restart() -> None:
            seen["keys"] = self.stack.redis.dbsize()
            down = time.monotonic()
            self.stack.redis_server.restart(wipe=True)
            seen["down_s"] = time.monotonic() - down

        self.on_wipe(restart)
        self.wipes += 1
        self.note(
            fault,
            f"Redis restarted empty ({seen.get('keys', -1):.0f} keys lost, "
            f"down {seen.get('down_s', 0.0):.2f}s); jobs without a result resubmitted",
        )

    # -- faults run by the campaign -------------------------------------------------

    def before_start(self, job_id: str) -> None:
        for fault in self.plan.faults:
            if fault.step < 0 and self.job_id(fault) == job_id:
                self.record(fault)
                self.cancel_storm(fault)

    def job_finished(self, job_id: str) -> None:
        for fault in self.plan.faults:
            if fault.kind == cp.REPLAY_STALE and self.job_id(fault) == job_id:
                thread = threading.Thread(target=self._replay, args=(fault,), daemon=True)
                self._threads.append(thread)
                thread.start()

    def _replay(self, fault: cp.FaultPlan) -> None:
        done = replay_step(self.stack, self.job_id(fault), fault.step, self.all_finished)
        if isinstance(done, str):
            self.note(fault, done, skipped=True)
            return
        self.replays.append(done)
        fired = self.record(fault, attempt=done.attempt, host=done.host or None)
        fired.detail = done.describe()

    def _orphan_fired(self, fault: cp.FaultPlan) -> None:
        ran = self.stack.find(
            "tool_result", tool="exec", job_id=self.job_id(fault), outcome="applied"
        )
        if not ran:
            self.note(fault, "the job never ran its exec step", skipped=True)
            return
        fired = self.record(fault, attempt=ran[0].get("attempt"))
        fired.at_s = round(_wall_s(str(ran[0].get("ts", ""))) - self.started_wall, 3)
        fired.detail = f"{len(ran)} exec run(s) left processes meant to write later"

    def settle(self, timeout_s: float = 60.0) -> None:
        """Join the replays; resolve what only the log can say (redelivery, crashes)."""
        give_up = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(timeout=max(0.1, give_up - time.monotonic()))
        self.host_faults.settle(give_up)
        for rule in self.stack.rules:
            fault = self._by_rule.get(id(rule))
            if fault is not None and rule.fired > 1:
                self.note(fault, f"fired {rule.fired} times")
        for fault in self.plan.faults:
            if fault.kind == cp.SLOW_REDELIVERY:
                watch = self.stack.find("job_watchdog", job_id=self.job_id(fault))
                if watch:
                    at_s = _wall_s(str(watch[0].get("ts", ""))) - self.started_wall
                    fired = self.record(fault, attempt=watch[0].get("attempt"))
                    fired.at_s = round(at_s, 3)
                    watched = sorted({int(w.get("attempt", 0)) for w in watch})
                    fired.detail = f"{len(watch)} watchdog copies while attempt(s) {watched} ran"
                else:
                    self.note(fault, "no copy was redelivered while it ran", skipped=True)
        for fault in self.plan.faults:
            if fault.kind == cp.EXEC_ORPHAN:
                self._orphan_fired(fault)
        for host in self.stack.hosts:
            armer = self._armed.pop(host.name, None)
            if armer is not None and host.faults.crash_armed():
                host.faults.disarm_crash()
                armer.skipped = True
                armer.detail += "; the armed call never reached its effect"


def _wall_s(ts: str) -> float:
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
