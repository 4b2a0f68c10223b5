"""Cancel while the job waits for the model (docs/architecture.md §Admission): capacity
stays counted until the backend confirms it is done with the request, then returns
exactly once."""

from __future__ import annotations

import json
from pathlib import Path

import redis

from ops.testing.fake_endpoint.plan import FakeEndpointConfig, ScriptStep
from ops.testing.fake_endpoint.server import serve
from runner.admission.desk import AdmissionDesk
from runner.core.settings import Settings
from tests.support.stack import run_cli, stack, wait_until


def test_cancel_during_inference(settings: Settings, tmp_path: Path) -> None:
    """The model holds the request; a cancel ends the job 'cancelled' while the desk still
    counts the lease; when the model answers, the lease is released once and only then."""
    server, port = serve(
        FakeEndpointConfig(
            script=(ScriptStep(tool="git_status"), ScriptStep(final="done")),
            service_ms_median=5,
            service_ms_p99=10,
        )
    )
    endpoint = server.endpoint
    endpoint.hold()  # admitted requests stay in service until release()
    eval_run = f"cancel-{tmp_path.name}"[:60]
    try:
        with stack(settings.with_(slots=1), tmp_path) as s:
            s.worker("w1")
            planner = {
                "kind": "openai",
                "base_url": f"http://127.0.0.1:{port}/v1",
                "model": "fake-model",
                "prompt": "look around",
                "request_timeout_s": 60,
                "admission_bound": 2,
            }
            spec = s.spec("infer-1", [], eval_run=eval_run)
            spec["planner"] = planner
            from runner.jobs.submit import submit

            submit(s.app, s.redis, spec)
            client = redis.Redis.from_url(s.settings.redis_url or "", decode_responses=True)
            desk = AdmissionDesk(client, eval_run, 2)
            wait_until(
                "the request to be in flight", lambda: desk.stats()["in_flight"] == 1 or None
            )
            proc = run_cli(s.settings, "cancel", "infer-1", "--json")
            assert proc.returncode == 0 and json.loads(proc.stdout)["outcome"] == "cancel_requested"
            result = s.result("infer-1")
            assert result.state == "cancelled", result.reason
            assert result.steps == []  # the model's answer never became a step
            # Cancelled, but the backend still holds the request: the capacity is counted.
            assert desk.stats()["in_flight"] == 1
            assert len(s.events("slot_released", job_id="infer-1")) == 1
            endpoint.release()
            wait_until("the confirmed release", lambda: desk.stats()["in_flight"] == 0 or None)
            stats = desk.stats()
            assert stats["committed"] == 0 and stats["double_release"] == 0
    finally:
        endpoint.release()
        server.close()
