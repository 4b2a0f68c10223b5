"""Poll until something holds: the one wait-with-deadline loop of slotrunner.

Waiting for a server to answer, a process to die, a slot to come free or a result to
land is the same loop each time: ask, and if the answer is not there yet and time is
left, sleep a little and ask again. :func:`poll_until` is that loop, with its clock
and its sleep injected, so a test can drive it with a fake clock and no real sleep.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from runner.errors import RunnerError

T = TypeVar("T")


class PollTimeout(RunnerError):
    """What was polled for did not happen within the time given."""


def poll_until(
    probe: Callable[[], T | None],
    timeout_s: float,
    interval_s: float = 0.1,
    *,
    what: str = "the condition",
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``probe()``'s first truthy answer; :class:`PollTimeout` once ``timeout_s`` has passed.

    ``probe`` is always asked at least once, and once more at the deadline (a sleep
    never runs past it), so a zero timeout means "ask once". An exception from
    ``probe`` ends the wait and propagates.
    """
    give_up = clock() + timeout_s
    while True:
        answer = probe()
        if answer:
            return answer
        left = give_up - clock()
        if left <= 0:
            raise PollTimeout(f"{what} did not happen within {timeout_s:g}s")
        sleep(min(interval_s, left))
