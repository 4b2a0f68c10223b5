"""Every Redis key slotrunner uses, in one place.

    slotrunner:slot:{host}:{slot_id}:generation   int   mirror of a slot's generation
                                                          (I5; the local stamp is the
                                                          high-water mark, this the copy)
    slotrunner:job:{job_id}:attempt               int   attempt fence: max(it, local floor)
                                                          + 1 per start, in the same Lua
                                                          script that sets the heartbeat
                                                          (runner/worker/liveness.py); a larger
                                                          value fences every older attempt.
                                                          The host's durable high-water mark
                                                          is $SLOTRUNNER_HOME/attempts/<job_id>
                                                          (I5; runner/worker/attempt_floor.py), so a
                                                          Redis wipe never reissues a number
    slotrunner:job:{job_id}:heartbeat             str   "{attempt}" of the running attempt,
                                                          PX = heartbeat TTL (a few seconds),
                                                          renewed ~1/s by its heartbeat
                                                          thread while it is still current;
                                                          absent = no live attempt
    slotrunner:job:{job_id}:result                str   JSON JobResult, committed once by
                                                          the current attempt (CAS in Lua)
    slotrunner:job:{job_id}:state                 str   queued|running|<terminal state>
    slotrunner:job:{job_id}:phase                 str   what a running job does before
                                                          its agent starts ("building
                                                          environment <key>: step 1/2"),
                                                          EX 24 h, deleted after
                                                          (runner/worker/environment.py)
    slotrunner:job:{job_id}:spec                  str   JSON JobSpec as submitted
    slotrunner:job:{job_id}:cancel                str   set (NX, to the request time) when
                                                          a cancel was requested
    slotrunner:jobs                               zset  job ids by submit time (epoch s);
                                                          the score is the job's submitted_at,
                                                          its deadline counts from it (a job
                                                          enqueued by plain Celery gets the
                                                          time of its first delivery)
    slotrunner:rejected                           hash  reason -> jobs rejected for it
                                                          (no_slot, deadline), bumped by the
                                                          same script that commits the result
    slotrunner:gateway:credential:{digest}        str   JSON grant of one agent's gateway
                                                          credential (run, job, attempt,
                                                          upstream, bound; runner/gateway/
                                                          credentials.py), keyed by the
                                                          SHA-256 of the secret, never the
                                                          secret; EX = the job's deadline
    admission:{eval_run}:*                              see runner/admission/lease.py

None of them may be evicted: a worker refuses to start against a Redis whose
``maxmemory-policy`` evicts keys (runner/worker/preflight.py).
"""

from __future__ import annotations

PREFIX = "slotrunner"


def slot_generation(host: str, slot_id: str) -> str:
    return f"{PREFIX}:slot:{host}:{slot_id}:generation"


def job_attempt(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:attempt"


def job_heartbeat(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:heartbeat"


def job_result(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:result"


def job_state(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:state"


def job_phase(job_id: str) -> str:
    """What a running job is doing before its agent starts ("building environment ...")."""
    return f"{PREFIX}:job:{job_id}:phase"


def job_spec(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:spec"


def job_cancel(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:cancel"


def gateway_credential(digest: str) -> str:
    return f"{PREFIX}:gateway:credential:{digest}"


JOBS = f"{PREFIX}:jobs"
REJECTED = f"{PREFIX}:rejected"
