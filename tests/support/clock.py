"""An injected clock for the admission desk's tests: time moves only when the desk sleeps."""

from __future__ import annotations

from collections.abc import Callable


class FakeClock:
    """A clock that moves only when the desk sleeps; `on_sleep` lets another worker act."""

    def __init__(self) -> None:
        self.now_s = 1000.0
        self.sleeps = 0
        self.on_sleep: Callable[[], object] | None = None

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps += 1
        self.now_s += seconds
        if self.on_sleep is not None:
            self.on_sleep()
