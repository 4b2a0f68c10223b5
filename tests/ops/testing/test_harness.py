"""The load harness: its pure accounting, and a sweep against the real fake endpoint."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from ops.testing.fake_endpoint.plan import FakeEndpointConfig
from ops.testing.fake_endpoint.server import FakeEndpointServer, serve
from ops.testing.harness.loop import (
    HarnessError,
    LoadConfig,
    chat_url,
    classify,
    retry_delay_s,
    run_point,
)
from ops.testing.harness.stats import (
    Attempt,
    Knee,
    Outcome,
    Point,
    find_knee,
    judge,
    percentile,
    summarize,
)
from runner.cli.main import main as slotrunner
from tests.support.ports import refusing_port

# --- pure: percentiles, series, knee, validity ----------------------------------------------


def test_percentile_is_nearest_rank() -> None:
    """Percentiles are measured values (nearest rank), and refuse empty input or a bad q."""
    values = [float(v) for v in range(100, 0, -1)]
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 0.50) == 50.0
    assert percentile(values, 1.0) == 100.0
    assert percentile(values, 0.0) == 1.0
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([10.0, 20.0], 0.99) == 20.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 0.5)
    with pytest.raises(ValueError, match="within"):
        percentile([1.0], 99)


def _ok(
    prompt: int,
    attempt: int,
    observed: float,
    queue: float = 0.01,
    service: float = 0.0,
    cid: str | None = None,
) -> Attempt:
    return Attempt(
        prompt,
        attempt,
        Outcome.OK,
        200,
        queue,
        observed,
        service or observed * 0.9,
        cid or f"id-{prompt}-{attempt}",
    )


def test_first_attempts_and_retries_are_never_pooled() -> None:
    """Slow retries show in their own series; the first-attempt p99 does not move."""
    firsts = [_ok(i, 1, 50.0 + i) for i in range(20)]
    rejected = [Attempt(i, 1, Outcome.HTTP_429, 429, 0.01, 1.0) for i in range(20, 25)]
    retries = [_ok(i, 2, 5000.0) for i in range(20, 25)]
    alone = summarize(firsts, mode="closed", concurrency=4, prompts=20, elapsed_s=1.0)
    mixed = summarize(
        firsts + rejected + retries, mode="closed", concurrency=4, prompts=25, elapsed_s=1.0
    )
    assert mixed.first == alone.first
    assert mixed.first.observed_ms.p99 == 69.0
    assert mixed.retry.count == 5 and mixed.retry.observed_ms.p99 == 5000.0
    assert mixed.retries == 5 and mixed.outcomes["http_429"] == 5
    assert mixed.rate_429 == pytest.approx(5 / 30)


def test_a_summary_counts_429s_timeouts_failures_and_duplicates() -> None:
    """429 and timeout rates sit beside the latency; failed prompts and duplicate ids count."""
    attempts = [
        _ok(0, 1, 10.0, cid="same"),
        Attempt(1, 1, Outcome.TIMEOUT, None, 0.0, 3000.0),
        _ok(1, 2, 10.0, cid="same"),
        Attempt(2, 1, Outcome.HTTP_429, 429, 0.0, 1.0),
        Attempt(2, 2, Outcome.HTTP_5XX, 503, 0.0, 1.0),
        Attempt(2, 3, Outcome.PROTOCOL_ERROR, 200, 0.0, 1.0),
    ]
    point = summarize(attempts, mode="closed", concurrency=2, prompts=3, elapsed_s=2.0)
    assert point.failed_prompts == 1 and point.duplicates_seen == 1
    assert point.throughput_rps == 1.0
    assert point.limit_rate == pytest.approx(2 / 6)
    assert point.timeout_rate == pytest.approx(1 / 6)
    assert point.first.count == 1 and point.retry.count == 1


def test_the_queue_share_is_p99_queue_over_p99_observed() -> None:
    """The series' queue share is p99(queue_wait) / p99(observed); transit is what is left."""
    attempts = [_ok(i, 1, 100.0, queue=10.0, service=80.0) for i in range(10)]
    first = summarize(attempts, mode="open", concurrency=1, prompts=10, elapsed_s=1.0).first
    assert first.queue_share == pytest.approx(0.1)
    assert first.transit_ms.p99 == pytest.approx(10.0)


def _point(
    c: int,
    rps: float,
    *,
    r429: float = 0.0,
    svc_p99: float = 50.0,
    queue: float = 0.01,
    timeouts: int = 0,
) -> Point:
    attempts = [_ok(i, 1, svc_p99 + 1, queue=queue, service=svc_p99) for i in range(10)]
    attempts += [Attempt(10 + i, 1, Outcome.TIMEOUT, None, 0.0, 1.0) for i in range(timeouts)]
    point = summarize(attempts, mode="closed", concurrency=c, prompts=10, elapsed_s=10 / rps)
    return replace(point, rate_429=r429)


@pytest.mark.parametrize(
    ("points", "knee"),
    [
        (
            [_point(1, 10), _point(2, 20), _point(4, 40), _point(8, 41)],
            Knee(4, "throughput_flat", 8),
        ),
        ([_point(1, 10), _point(2, 20), _point(4, 40, r429=0.2)], Knee(2, "429s_appear", 4)),
        # A p99 of 10 samples, throughput doubling: no evidence, not a knee (#17).
        ([_point(1, 10), _point(2, 20, svc_p99=101.0)], Knee(2, "not_reached", None)),
        ([_point(1, 10), _point(2, 20, timeouts=1)], Knee(1, "timeouts_rise", 2)),
        ([_point(1, 10), _point(2, 20), _point(4, 40)], Knee(4, "not_reached", None)),
        ([_point(1, 10, r429=0.5), _point(2, 20)], Knee(None, "429s_appear", 1)),
        ([_point(8, 80), _point(1, 10), _point(4, 40, r429=0.1)], Knee(1, "429s_appear", 4)),
    ],
)
def test_the_knee_is_the_last_level_before_the_first_saturation_signal(
    points: list[Point], knee: Knee
) -> None:
    """Throughput flat, 429s or timeouts end the rise; order is by C."""
    assert find_knee(points) == knee


def test_validity_needs_a_small_queue_share_completions_and_a_level_within_the_knee() -> None:
    """A run is invalid for harness queueing, for no completions, or for being above the knee."""
    knee = Knee(8, "429s_appear", 16)
    assert judge(_point(4, 40), knee).valid
    assert judge(_point(8, 80), knee).valid
    assert judge(_point(16, 80), knee).reasons == ("above_knee",)
    assert judge(_point(4, 40, queue=2.6), knee).reasons == ("queue_wait_share",)
    assert judge(_point(4, 40, queue=2.4), knee).valid  # 2.4 / 51 < 5 %
    assert judge(_point(1, 10), Knee(None, "429s_appear", 1)).reasons == ("above_knee",)
    empty = summarize([], mode="closed", concurrency=1, prompts=5, elapsed_s=1.0)
    assert judge(empty, knee).reasons == ("no_completed_first_attempts",)


# --- pure: what the harness does with one answer ---------------------------------------------


def test_a_429_waits_its_retry_after_and_other_failures_back_off_with_a_cap() -> None:
    """Retry-After is honoured (plus at most 10 % jitter); else jittered exponential, capped."""
    rng = random.Random(1)
    for _ in range(50):
        assert 2.0 <= retry_delay_s(Outcome.HTTP_429, 1, "2", rng, 10.0) <= 2.2
        assert retry_delay_s(Outcome.HTTP_429, 1, "60", rng, 10.0) == 10.0
        assert 0.05 <= retry_delay_s(Outcome.HTTP_5XX, 1, None, rng, 10.0) <= 0.1
        assert 0.2 <= retry_delay_s(Outcome.TIMEOUT, 3, None, rng, 10.0) <= 0.4
        assert retry_delay_s(Outcome.TIMEOUT, 30, None, rng, 1.5) <= 1.5
        date = "Wed, 21 Oct 2015 07:28:00 GMT"
        assert retry_delay_s(Outcome.HTTP_429, 1, date, rng, 10.0) <= 0.1


def test_answers_are_classified_by_status_and_body() -> None:
    """Only a 200 whose body is a chat completion is ok; the rest name what went wrong."""
    good = json.dumps({"id": "c1", "choices": [{"message": {"role": "assistant"}}]}).encode()
    assert classify(200, good) == (Outcome.OK, "c1")
    assert classify(200, b"") == (Outcome.PROTOCOL_ERROR, None)
    assert classify(200, b'{"id": "x", "choices": []}') == (Outcome.PROTOCOL_ERROR, None)
    assert classify(200, b'{"id": 7, "choices": [{"message": {}}]}')[0] is Outcome.PROTOCOL_ERROR
    assert classify(429, b"") == (Outcome.HTTP_429, None)
    assert classify(503, b"") == (Outcome.HTTP_5XX, None)
    assert classify(404, b"") == (Outcome.HTTP_4XX, None)


def test_the_url_may_be_a_base_a_v1_or_the_full_path() -> None:
    """Any of the three spellings reaches /v1/chat/completions; a non-HTTP URL is refused."""
    full = "http://127.0.0.1:9/v1/chat/completions"
    for url in ("http://127.0.0.1:9", "http://127.0.0.1:9/", "http://127.0.0.1:9/v1/", full):
        assert chat_url(url) == full
    for bad in ("ftp://x/v1", "127.0.0.1:9", "http:///v1"):
        with pytest.raises(HarnessError, match="--url"):
            chat_url(bad)


def test_a_load_config_refuses_incoherent_settings() -> None:
    """Open loop needs a rate, closed loop refuses one; counts and timeouts must be positive."""
    url = "http://127.0.0.1:9/v1/chat/completions"
    with pytest.raises(HarnessError, match="--rate"):
        LoadConfig(url=url, prompts=1, mode="open")
    with pytest.raises(HarnessError, match="--open-loop"):
        LoadConfig(url=url, prompts=1, rate_rps=5.0)
    with pytest.raises(HarnessError, match="prompts"):
        LoadConfig(url=url, prompts=0)


# --- against the fake endpoint ------------------------------------------------------------------

LIMIT = 8
ENDPOINT = {
    "max_concurrency": LIMIT,
    "service_ms_median": 50.0,
    "service_ms_p99": 100.0,
    "retry_after_s": 1,
    "seed": 3,
}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[tuple[FakeEndpointServer, str]]:
    server, port = serve(FakeEndpointConfig.model_validate(ENDPOINT))
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        server.close()


def _sweep(base: str, tmp: Path, *args: str) -> tuple[Result, dict[str, Any]]:
    out = tmp / "report.json"
    result = CliRunner().invoke(
        slotrunner,
        ["harness", "sweep", "--url", base, "--timeout-s", "10", "--json-out", str(out), *args],
    )
    assert result.exit_code == 0, result.output
    return result, json.loads(out.read_text())


@pytest.fixture(scope="module")
def closed_sweep(
    endpoint: tuple[FakeEndpointServer, str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Result, dict[str, Any], Path]:
    tmp = tmp_path_factory.mktemp("sweep")
    plot = tmp / "sweep.png"
    result, report = _sweep(
        endpoint[1], tmp, "--concurrency", "1,2,4,8,16,32", "--prompts", "120", "--plot", str(plot)
    )
    return result, report, plot


def test_the_closed_loop_sweep_reports_the_knee_at_the_endpoint_limit(closed_sweep: Any) -> None:
    """Against a limit of 8 the knee is 8 (± one step), and 429s are what showed it."""
    result, report, _ = closed_sweep
    levels = [p["concurrency"] for p in report["points"]]
    assert levels == [1, 2, 4, 8, 16, 32]
    assert report["knee"]["concurrency"] in (4, 8, 16)
    assert "knee: C=" in result.output
    over = [p for p in report["points"] if p["concurrency"] > LIMIT]
    assert all(p["outcomes"]["http_429"] > 0 and p["rate_429"] > 0 for p in over)
    assert all(p["retries"] > 0 and p["retry"]["count"] > 0 for p in over)


def test_closed_loop_runs_up_to_the_knee_are_valid_and_above_it_invalid(closed_sweep: Any) -> None:
    """Below the knee the harness owns under 5 % of p99; above it runs are marked invalid."""
    _, report, _ = closed_sweep
    knee = report["knee"]["concurrency"]
    for point in report["points"]:
        if point["concurrency"] <= knee:
            assert point["valid"], point["invalid_reasons"]
            assert point["first"]["queue_share"] < 0.05
        else:
            assert "above_knee" in point["invalid_reasons"]
        assert "limit_rate" in point and "timeout_rate" in point


def test_the_endpoint_never_had_more_in_service_than_its_limit(
    closed_sweep: Any, endpoint: tuple[FakeEndpointServer, str]
) -> None:
    """The sweep pushed past the limit; the endpoint saw at most its limit in flight."""
    stats = endpoint[0].endpoint.stats()
    assert stats["max_in_flight_seen"] == LIMIT
    assert stats["answered_429"] > 0


def test_the_sweep_writes_a_table_a_json_report_and_a_png(closed_sweep: Any) -> None:
    """The terminal table, the JSON report and the PNG plot are all produced."""
    result, report, plot = closed_sweep
    assert "queue share" in result.output and "INVALID" in result.output
    assert report["rule"]["max_queue_share"] == 0.05
    # Which statistic decided the knee is said in both (#17).
    assert report["knee"]["statistic"] and isinstance(report["knee"]["notes"], list)
    assert f"decided by {report['knee']['statistic']}: " in result.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_open_loop_run_past_capacity_is_flagged_invalid_with_its_queue_share(
    endpoint: tuple[FakeEndpointServer, str], tmp_path: Path
) -> None:
    """A fixed rate above what 8 slots can serve queues inside the harness: invalid, share shown."""
    result, report = _sweep(
        endpoint[1],
        tmp_path,
        "--open-loop",
        "--rate",
        "600",
        "--concurrency",
        "8",
        "--prompts",
        "64",
    )
    (point,) = report["points"]
    assert report["mode"] == "open" and point["mode"] == "open"
    assert not point["valid"] and "queue_wait_share" in point["invalid_reasons"]
    assert point["first"]["queue_share"] >= 0.05
    assert point["first"]["queue_wait_ms"]["p99"] > point["first"]["service_ms"]["p99"]
    assert "queue_wait_share" in result.output


def test_a_slow_tail_shows_in_the_service_clock_not_smeared() -> None:
    """5-10 % of requests at 10x: the service p99 shows them, the median does not move."""
    server, port = serve(
        FakeEndpointConfig(
            service_ms_median=20.0, service_ms_p99=30.0, slow_prob=0.1, slow_ms=300.0, seed=5
        )
    )
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        # A fixed run id: the same prompts, so the seeded endpoint draws the same slow ones.
        config = LoadConfig(url=url, prompts=40, run_id="slowtail")
        point = run_point(config, 4)
    finally:
        server.close()
    service = point.first.service_ms
    assert service.p99 is not None and service.p99 >= 300.0
    assert service.p50 is not None and service.p50 < 100.0
    assert point.first.queue_share is not None and point.first.queue_share < 0.05


# --- the command's refusals -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "http://127.0.0.1:{free}"], "cannot reach"),
        (["--url", "{base}/v2"], "answered 404"),
        (["--url", "{base}", "--rate", "5"], "--open-loop"),
        (["--url", "{base}", "--open-loop"], "--rate"),
        (["--url", "{base}", "--concurrency", "1,x"], "'x' is not a positive integer"),
        (["--url", "{base}", "--concurrency", "0"], "'0' is not a positive integer"),
        (["--url", "nowhere"], "--url"),
        (["--url", "{base}", "--api-key-env", "SLOTRUNNER_TEST_UNSET_KEY"], "is not set"),
    ],
)
def test_bad_input_is_one_clear_line(
    endpoint: tuple[FakeEndpointServer, str], args: list[str], message: str
) -> None:
    """Unreachable, wrong path, or incoherent flags: exit 2, the problem named, no traceback."""
    with refusing_port() as free:
        argv = [a.format(base=endpoint[1], free=free) for a in args]
        result = CliRunner().invoke(slotrunner, ["harness", "sweep", "--prompts", "2", *argv])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
