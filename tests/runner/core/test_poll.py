"""poll_until (runner/core/poll.py) on a fake clock: no real sleep, exact sleeps."""

from __future__ import annotations

import pytest

from runner.core.poll import PollTimeout, poll_until
from runner.errors import RunnerError
from tests.support.clock import FakeClock


def test_returns_the_first_truthy_answer_without_sleeping_after_it() -> None:
    clock = FakeClock()
    answers = iter([None, 0, "", "found", "later"])
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.sleep(seconds)

    assert poll_until(lambda: next(answers), 10.0, 0.5, clock=clock, sleep=sleep) == "found"
    assert slept == [0.5, 0.5, 0.5]


def test_times_out_asking_once_more_at_the_deadline() -> None:
    clock = FakeClock()
    start = clock.now_s
    asked: list[float] = []

    def probe() -> bool:
        asked.append(clock.now_s - start)
        return False

    with pytest.raises(PollTimeout, match=r"the slot did not happen within 1s") as caught:
        poll_until(probe, 1.0, 0.4, what="the slot", clock=clock, sleep=clock.sleep)
    assert isinstance(caught.value, RunnerError)
    # The last sleep is cut to the deadline, and the probe is asked there once more.
    assert asked == pytest.approx([0.0, 0.4, 0.8, 1.0])


def test_zero_timeout_asks_once() -> None:
    clock = FakeClock()
    with pytest.raises(PollTimeout):
        poll_until(lambda: None, 0.0, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == 0
    assert poll_until(lambda: 7, 0.0, clock=clock, sleep=clock.sleep) == 7


def test_an_exception_from_the_probe_ends_the_wait() -> None:
    clock = FakeClock()

    def probe() -> None:
        raise KeyError("gone")

    with pytest.raises(KeyError, match="gone"):
        poll_until(probe, 5.0, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == 0
