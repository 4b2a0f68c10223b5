"""The detector's emergency brake: make every worker stop taking jobs from the queue.

``cancel_consumer`` is a Celery broadcast: each worker stops consuming ``queue`` and
finishes what it holds (a job mid-apply is not killed, so no new outcome-unknown is
created by the brake itself). No new job can then lease a recycled slot, which is
what turns one cross-job write into many (docs/architecture.md §Problem: the pool stops
before more slots recycle). Restart consumption with ``celery control add_consumer``.
"""

from __future__ import annotations

from collections.abc import Callable

import celery

DEFAULT_QUEUE = "slotrunner"


def stop_pool(broker_url: str, queue: str = DEFAULT_QUEUE, timeout_s: float = 1.0) -> list[str]:
    """Tell every worker on ``broker_url`` to stop consuming ``queue``; the names that replied."""
    # A bare app: the detector must not import the runner's task modules (or connect
    # anything at import) just to send one broadcast.
    app = celery.Celery(broker=broker_url, set_as_current=False)
    try:
        replies = app.control.cancel_consumer(queue, reply=True, timeout=timeout_s) or []
    finally:
        app.close()
    return sorted({name for reply in replies for name in reply})


class PoolBrake:
    """Pulls the brake once, on the first incident, and remembers what happened for pages."""

    def __init__(self, broker_url: Callable[[], str], queue: str = DEFAULT_QUEUE) -> None:
        self._broker_url = broker_url
        self._queue = queue
        self.note: str | None = None

    def pull(self) -> str:
        """Stop the pool unless already done; a sentence saying what was done."""
        if self.note is None:
            try:
                workers = stop_pool(self._broker_url(), self._queue)
            except Exception as exc:  # any broker or config failure: the page must still go out
                self.note = f"pool NOT stopped (cancel_consumer {self._queue!r} failed: {exc})"
            else:
                who = ", ".join(workers) if workers else "no worker replied"
                self.note = f"pool stopped: cancel_consumer {self._queue!r} acknowledged by {who}"
        return self.note
