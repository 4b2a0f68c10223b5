"""Log event names of job liveness, cancellation and the janitor.

They extend ``runner.core.events`` (whose names the detector relies on); none of these is
read by ``ops.detect.detector``, which judges applies against ``slot_leased``/``slot_released``
alone. ``slot_reclaimed``, ``receipt_resolved`` and ``slot_poisoned`` are reused from
``runner.core.events``.
"""

from __future__ import annotations

from typing import Final

# a delivery found a live attempt and watches it instead of starting a second copy:
# job_id, attempt (the live one), pid
JOB_WATCHDOG: Final = "job_watchdog"
# a watched attempt's heartbeat went stale and this delivery took over:
# job_id, attempt (the new one), stale_attempt
JOB_TAKEOVER: Final = "job_takeover"
# a delivery found the job's result already committed: job_id, state
JOB_ALREADY_FINISHED: Final = "job_already_finished"
# an attempt learnt a newer attempt fenced it and stopped: job_id, attempt, current
JOB_SUPERSEDED: Final = "job_superseded"
# `slotrunner cancel` recorded a request: job_id, outcome, repeated
JOB_CANCEL_REQUESTED: Final = "job_cancel_requested"
# a running job saw its cancel between steps and marked its slot:
# slot_id, generation, job_id, attempt
SLOT_CANCEL_REQUESTED: Final = "slot_cancel_requested"
# the heartbeat thread hit an error (a Redis blip, a lease renewal that failed);
# the next tick tries again: job_id, attempt, where, error
JOB_HEARTBEAT_ERROR: Final = "job_heartbeat_error"
# a janitor sweep failed as a whole (a Redis blip); the next sweep tries again: error
JANITOR_ERROR: Final = "janitor_error"
# a delivery's spec failed validation (sent past runner.jobs.submit): nothing was
# claimed, leased or written to Redis; job_id (None unless the spec names a valid
# one), reason ("invalid job spec: <field>: <problem>; ...")
JOB_SPEC_REFUSED: Final = "job_spec_refused"
# a command planner's agent process started: job_id, attempt, pid, program, cgroup
AGENT_STARTED: Final = "agent_started"
# ... and it and every process it started are gone (logged before the slot's release):
# job_id, attempt, pid, ended_by (exited | deadline | a stop reason), exit_code,
# leftovers (other processes of its tree killed), survivors (pids that would not die)
AGENT_ENDED: Final = "agent_ended"
# an attempt ended what was left of an older attempt's agent on this host (its worker
# died): job_id, attempt, older_attempt, killed
AGENT_LEFTOVERS_ENDED: Final = "agent_leftovers_ended"
# a job's environment (runner.envs) was built by this job: job_id, attempt, key,
# build_s, log; once per build, so a key's builds are counted by these lines
ENVIRONMENT_BUILT: Final = "environment_built"
# ... was found built and taken: job_id, attempt, key, wait_s (waiting for a build)
ENVIRONMENT_REUSED: Final = "environment_reused"
# ... could not be built or used (the job fails): job_id, attempt, key, error
ENVIRONMENT_FAILED: Final = "environment_failed"
# a slot's view for `slots list --pool` (runner/slots/pool_view.py) could not be written;
# the stamp stands and the next host beat heals the view: slot_id, error
SLOT_VIEW_ERROR: Final = "slot_view_error"
# a host beat (runner/slots/host_beat.py) failed; the next one tries again: error
HOST_BEAT_ERROR: Final = "host_beat_error"
