"""Every Redis key slotrunner uses, in one place.

    slotrunner:slot:{host}:{slot_id}:generation   int   mirror of a slot's generation
                                                          (I5; the local stamp is the
                                                          high-water mark, this the copy)
    slotrunner:slot:{host}:{slot_id}              hash  the slot's view for `slots list
                                                          --pool`: generation, job_id,
                                                          attempt, state, reason, since,
                                                          lease_expires_at ("" = none);
                                                          written after each change of the
                                                          local stamp (which stays the
                                                          truth) and healed by the host
                                                          beat (runner/slots/pool_view.py)
    slotrunner:host:{host}                        hash  the host's last beat: beat_at (ISO,
                                                          the writer's clock: display only),
                                                          slots, toolserver_url, interval_s,
                                                          dead_after_s (runner/slots/host_beat.py)
    slotrunner:host:{host}:alive                  str   "1", PX = dead_after_s (3 beats),
                                                          renewed by every worker of the host;
                                                          absent = the host is dead (Redis's
                                                          clock decides, so no host's clock
                                                          skew can make another look dead)
    slotrunner:host:{host}:slots                  set   the slot ids with a view
    slotrunner:hosts                              set   every host id that published a view
                                                          or a beat
    slotrunner:job:{job_id}:attempt               int   attempt fence: max(it, local floor)
                                                          + 1 per start, in the same Lua
                                                          script that sets the heartbeat
                                                          (runner/worker/liveness.py); a larger
                                                          value fences every older attempt.
                                                          The host's durable high-water mark
                                                          is $SLOTRUNNER_HOME/attempts/<job_id>
                                                          (I5; runner/worker/attempt_floor.py), so a
                                                          Redis wipe never reissues a number
                                                          on that host; across hosts the
                                                          epoch below does it
    slotrunner:attempts:epoch                     hash  id (random hex), born_ms (Redis's
                                                          TIME), reborn ("1" when a claim
                                                          brought evidence of an older epoch:
                                                          Redis lost its data); a job without
                                                          a counter in a reborn epoch starts
                                                          at born_ms + 1, above every number
                                                          any host issued before the loss
                                                          (runner/worker/liveness.py)
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


def slot_view(host: str, slot_id: str) -> str:
    """A slot's state as seen by ``slots list --pool`` (a mirror; the stamp is the truth)."""
    return f"{PREFIX}:slot:{host}:{slot_id}"


def host_beat(host: str) -> str:
    return f"{PREFIX}:host:{host}"


def host_alive(host: str) -> str:
    """Present while the host beats; its TTL, not a clock comparison, says dead."""
    return f"{PREFIX}:host:{host}:alive"


def host_slots(host: str) -> str:
    return f"{PREFIX}:host:{host}:slots"


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
ATTEMPT_EPOCH = f"{PREFIX}:attempts:epoch"
REJECTED = f"{PREFIX}:rejected"
HOSTS = f"{PREFIX}:hosts"
