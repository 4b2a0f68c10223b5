"""ops.detect.follow, ops.page, ops.pool: live logs, rotation, restarts, paging, the brake."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import celery
import pytest
from click.testing import CliRunner

from ops.cli import ops
from ops.detect.detector import Incident, Kind, Malformed
from ops.detect.follow import Follower
from ops.page import PageError, Pager
from runner.core.poll import PollTimeout, poll_until
from runner.redis_server import EmbeddedRedis
from tests.support.detectlog import lease_line, result_line
from tests.support.ports import refusing_port
from tests.support.repos import REPO


class Receiver:
    """A real webhook on 127.0.0.1 that records the alert lists posted to it.

    It answers the ``statuses`` given first (one per request), then 200."""

    def __init__(self, statuses: tuple[int, ...] = (), port: int = 0) -> None:
        self.bodies: list[list[dict[str, Any]]] = []
        self.requests = 0
        self._statuses = list(statuses)
        self._lock = threading.Lock()
        self._posted = threading.Condition(self._lock)  # notified after each request
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer._lock:
                    outer.requests += 1
                    status = outer._statuses.pop(0) if outer._statuses else 200
                    if status == 200:
                        outer.bodies.append(body)
                    outer._posted.notify_all()
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v2/alerts"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def alerts(self) -> list[dict[str, Any]]:
        with self._lock:
            return self._alerts()

    def _alerts(self) -> list[dict[str, Any]]:
        return [alert for body in self.bodies for alert in body]

    def wait_alerts(self, count: int, timeout_s: float = 20.0) -> list[dict[str, Any]]:
        """The alerts once ``count`` were posted, woken by each request (no polling)."""
        with self._posted:
            if not self._posted.wait_for(lambda: len(self._alerts()) >= count, timeout_s):
                raise AssertionError(
                    f"{len(self._alerts())} alerts after {timeout_s:g}s, not {count}"
                )
            return self._alerts()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Polls:
    """A sink that passes each poll's items on, then wakes whoever waits on the follower."""

    def __init__(self, sink: Callable[[list[Any]], None]) -> None:
        self._sink = sink
        self._polled = threading.Condition()

    def __call__(self, items: list[Any]) -> None:
        self._sink(items)
        with self._polled:
            self._polled.notify_all()

    def wait(self, cond: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
        with self._polled:
            if not self._polled.wait_for(cond, timeout_s):
                raise AssertionError(f"timed out waiting for {what}")


def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Poll for a readiness sign another process gives (a file it writes, a ping)."""
    try:
        poll_until(cond, timeout_s, 0.02, what=what)
    except PollTimeout:
        raise AssertionError(f"timed out waiting for {what}") from None


def append(path: Path, *lines: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(b"".join(line + b"\n" for line in lines))


def paging_sink(pager: Pager, seen: list[Incident | Malformed]) -> Callable[[list[Any]], None]:
    def sink(items: list[Incident | Malformed]) -> None:
        seen.extend(items)
        pager.page([i for i in items if isinstance(i, Incident)])

    return sink


def kinds(items: list[Incident | Malformed]) -> list[tuple[str, int]]:
    return [(i.kind, i.line) for i in items if isinstance(i, Incident)]


# -- follow ---------------------------------------------------------------------------


def test_live_cross_job_line_is_paged_and_a_restart_neither_rereads_nor_repages(
    tmp_path: Path, receiver: Receiver
) -> None:
    """A cross-job line appended to a live log is paged; a restarted follower goes on from there."""
    log, state = tmp_path / "slotrunner.jsonl", tmp_path / "state"
    append(log, lease_line("A", 1), result_line("A", 1, "A:1", receipt_job="A"))
    pager = Pager(receiver.url, state)
    seen: list[Incident | Malformed] = []
    polls = Polls(paging_sink(pager, seen))
    follower = Follower([str(log)], state, polls)
    stop = threading.Event()
    thread = threading.Thread(target=follower.run, args=(stop, 0.05))
    thread.start()
    try:
        polls.wait(lambda: follower.lines == 2, "the lines already there")
        append(log, result_line("B", 1, "B:1", receipt_job="B"))
        receiver.wait_alerts(1)
    finally:
        stop.set()
        thread.join(10)
        follower.close()
        pager.close()
    [alert] = receiver.alerts
    assert alert["labels"]["alertname"] == "slotrunner_cross_job_apply"
    assert alert["labels"]["severity"] == "page"
    assert alert["labels"]["slot_id"] == "S1" and alert["labels"]["job_id"] == "B"
    assert f"{log}:3" in alert["annotations"]["description"]
    assert alert["startsAt"] == "2025-01-01T00:00:00Z"

    pager = Pager(receiver.url, state)
    again: list[Incident | Malformed] = []
    follower = Follower([str(log)], state, paging_sink(pager, again))
    try:
        follower.poll()
        assert follower.lines == 3 and again == []
        append(log, result_line("A", 1, "A:1", receipt_job="A"))
        follower.poll()
    finally:
        follower.close()
        pager.close()
    assert kinds(again) == [(Kind.DUPLICATE, 4)]  # the key set survived the restart too
    assert receiver.requests == 2


def test_a_crash_after_paging_before_the_checkpoint_pages_once(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Lines re-read after a crash find the incident again; the page log keeps it to one page."""
    log, state = tmp_path / "slotrunner.jsonl", tmp_path / "state"
    append(log, lease_line("A", 1))
    pager = Pager(receiver.url, state)
    first: list[Incident | Malformed] = []
    follower = Follower([str(log)], state, paging_sink(pager, first))
    follower.poll()
    before = (state / "checkpoint.json").read_bytes()
    append(log, result_line("B", 1, "B:1", receipt_job="B"), result_line("A", 1, "A:1"))
    follower.poll()
    follower.close()
    pager.close()
    (state / "checkpoint.json").write_bytes(before)  # the process died before replacing it
    pager = Pager(receiver.url, state)
    second: list[Incident | Malformed] = []
    follower = Follower([str(log)], state, paging_sink(pager, second))
    try:
        follower.poll()
    finally:
        follower.close()
        pager.close()
    assert kinds(first) == kinds(second) == [(Kind.CROSS_JOB, 2)]  # A:1 is no duplicate
    assert receiver.requests == 1


def test_a_version_1_state_dir_keeps_its_keys(tmp_path: Path) -> None:
    """A state dir from before keys.sqlite (digests in keys.hex) is imported: its keys
    still make a repeat a duplicate."""
    from hashlib import blake2b

    log, state = tmp_path / "slotrunner.jsonl", tmp_path / "state"
    append(log, lease_line("A", 1), result_line("A", 1, "A:1"))
    follower = Follower([str(log)], state, lambda _: None)
    follower.poll()
    follower.close()
    ckpt = json.loads((state / "checkpoint.json").read_bytes())
    journal = (blake2b(b"A:1", digest_size=16).hexdigest() + "\n").encode()
    (state / "keys.hex").write_bytes(journal)
    for leftover in state.glob("keys.sqlite*"):
        leftover.unlink()
    del ckpt["keys"]
    ckpt.update(version=1, keys_bytes=len(journal))
    (state / "checkpoint.json").write_text(json.dumps(ckpt))
    append(log, result_line("A", 1, "A:1"))
    seen: list[Incident | Malformed] = []
    follower = Follower([str(log)], state, seen.extend)
    try:
        follower.poll()
    finally:
        follower.close()
    assert kinds(seen) == [(Kind.DUPLICATE, 3)]
    assert json.loads((state / "checkpoint.json").read_bytes())["version"] == 2


def test_rotation_finishes_the_old_inode_then_reads_the_new_file(tmp_path: Path) -> None:
    """Renamed log: late lines on the old inode and its torn tail are read, then the new file."""
    log, state, clock = tmp_path / "slotrunner.jsonl", tmp_path / "state", Clock()
    append(log, lease_line("A", 1), result_line("A", 1, "A:1"))
    seen: list[Incident | Malformed] = []
    follower = Follower([str(log)], state, seen.extend, rotate_grace_s=2.0, clock=clock)
    try:
        follower.poll()
        # A process still holding the old descriptor writes after the rename.
        with open(log, "ab", buffering=0) as writer:
            os.rename(log, tmp_path / "slotrunner.jsonl.1")
            follower.poll()
            writer.write(result_line("A", 1, "A:2") + b"\n")
            append(log, lease_line("A", 1, released=True), lease_line("B", 2))
            append(log, result_line("A", 1, "A:3"))
            follower.poll()
            writer.write(b'{"event": "tool_result", "outc')  # torn by a crash: no newline ever
        follower.poll()
        assert follower.lines == 6  # the torn tail waits for the grace period
        clock.now += 3
        follower.poll()
    finally:
        follower.close()
    assert follower.lines == 7
    assert kinds(seen) == [(Kind.STALE, 3)]
    assert [(m.line, m.path) for m in seen if isinstance(m, Malformed)] == [(4, str(log))]
    ckpt = json.loads((state / "checkpoint.json").read_bytes())
    assert [c["ino"] for c in ckpt["files"][str(log)]] == [os.stat(log).st_ino]


def test_rotation_while_stopped_is_finished_from_the_rotated_file(tmp_path: Path) -> None:
    """Restarted after a rotation: the old file's rest (found beside the path) comes first."""
    log, state, clock = tmp_path / "slotrunner.jsonl", tmp_path / "state", Clock()
    append(log, lease_line("A", 1))
    follower = Follower([str(log)], state, lambda _: None, clock=clock)
    follower.poll()
    follower.close()
    append(log, result_line("A", 1, "A:1"), lease_line("A", 1, released=True))
    os.rename(log, tmp_path / "slotrunner.jsonl.1")
    append(log, lease_line("B", 2), result_line("A", 1, "A:2"), result_line("B", 2, "B:1"))
    seen: list[Incident | Malformed] = []
    follower = Follower([str(log)], state, seen.extend, clock=clock)
    try:
        follower.poll()
        clock.now += 5
        follower.poll()
    finally:
        follower.close()
    assert follower.lines == 6
    assert kinds(seen) == [(Kind.STALE, 2)]


def test_truncated_log_is_read_again_from_the_start(tmp_path: Path) -> None:
    """copytruncate: an offset beyond the size means start from 0; the new lines are judged."""
    log, state = tmp_path / "slotrunner.jsonl", tmp_path / "state"
    append(log, lease_line("A", 1), result_line("A", 1, "A:1"), result_line("A", 1, "A:2"))
    seen: list[Incident | Malformed] = []
    warnings: list[str] = []
    follower = Follower([str(log)], state, seen.extend, warn=warnings.append)
    try:
        follower.poll()
        log.write_bytes(result_line("C", 1, "C:1") + b"\n")
        follower.poll()
    finally:
        follower.close()
    assert follower.lines == 4
    assert kinds(seen) == [(Kind.CROSS_JOB, 1)]
    assert "truncated" in warnings[0]


def test_follow_cli_pages_a_live_line_and_ends_on_sigterm(
    tmp_path: Path, receiver: Receiver
) -> None:
    """detect --follow as a real process: an appended line is paged; SIGTERM ends it with 1."""
    log, state = tmp_path / "slotrunner.jsonl", tmp_path / "state"
    append(log, lease_line("A", 1))
    argv = [
        sys.executable,
        "-m",
        "ops.cli",
        "detect",
        "--follow",
        "--json",
        "--webhook",
        receiver.url,
        "--state-dir",
        str(state),
        str(log),
    ]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (state / "checkpoint.json").exists(), "the follower to start")
        append(log, result_line("B", 1, "B:1", receipt_job="B"))
        receiver.wait_alerts(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    assert len(receiver.alerts) == 1
    *incidents, summary = [json.loads(line) for line in out.splitlines()]
    assert [(o["kind"], o["line"]) for o in incidents] == [(Kind.CROSS_JOB, 2)]
    assert summary["kind"] == "summary" and summary["lines"] == 2


# -- paging -----------------------------------------------------------------------------


def _incident(key: str = "B:1") -> Incident:
    return Incident(
        Kind.CROSS_JOB, "log", 2, "B", "S1", 1, "apply_patch", key, "h1", "2025-01-01T00:00:00Z"
    )


def test_pager_retries_5xx_and_delivers_once(tmp_path: Path) -> None:
    """503 then 500, then 200: delivered once, after three requests (stamina backoff)."""
    receiver = Receiver(statuses=(503, 500))
    pager = Pager(receiver.url, tmp_path / "state")
    try:
        assert pager.page([_incident()]) == 1
        assert pager.page([_incident()]) == 0
    finally:
        pager.close()
        receiver.close()
    assert receiver.requests == 3 and len(receiver.alerts) == 1


def test_pager_keeps_alerts_while_the_receiver_is_down_and_across_restarts(tmp_path: Path) -> None:
    """Receiver down: PageError, the alert stays queued on disk and goes out once it is up."""
    with refusing_port() as port:  # held until the receiver takes it
        url, state = f"http://127.0.0.1:{port}/api/v2/alerts", tmp_path / "state"
        pager = Pager(url, state, attempts=3, timeout_s=5.0, wait_max_s=0.2)
        with pytest.raises(PageError, match="could not page"):
            pager.page([_incident()])
        pager.close()
    receiver = Receiver(port=port)
    try:
        pager = Pager(url, state)
        assert pager.pending == 1
        assert pager.deliver() == 1
        pager.close()
        pager = Pager(url, state)
        assert pager.page([_incident()]) == 0 and pager.pending == 0
        pager.close()
    finally:
        receiver.close()
    assert receiver.requests == 1


def test_pager_does_not_retry_a_4xx(tmp_path: Path) -> None:
    """A 400 is a configuration error: one request, PageError, the alert kept."""
    receiver = Receiver(statuses=(400,))
    pager = Pager(receiver.url, tmp_path / "state")
    try:
        with pytest.raises(PageError, match="HTTP 400"):
            pager.page([_incident()])
        assert pager.pending == 1
    finally:
        pager.close()
        receiver.close()
    assert receiver.requests == 1


def test_a_torn_line_in_the_page_log_does_not_swallow_the_next_record(tmp_path: Path) -> None:
    """A crash mid-append leaves a torn line: it reads as absent and the next record survives."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "outbox.jsonl").write_bytes(b'{"id": "torn", "ale')
    pager = Pager("http://127.0.0.1:9/", state)
    assert pager.pending == 0
    assert pager.enqueue([_incident()]) == 1
    pager.close()
    pager = Pager("http://127.0.0.1:9/", state)
    assert pager.pending == 1
    pager.close()


# -- the pool brake ---------------------------------------------------------------------


def test_stop_pool_cancels_the_consumer_and_the_page_says_so(
    tmp_path: Path, receiver: Receiver
) -> None:
    """--stop-pool: on the first incident the worker stops consuming, and the page names it."""
    # An own Redis: the broadcast must reach no worker of another test.
    server = EmbeddedRedis(tmp_path / "redis-home")
    url = server.ensure()
    (tmp_path / "poolapp.py").write_text(
        "import celery, os\napp = celery.Celery(broker=os.environ['REDIS_URL'])\n"
    )
    name = f"brake-{uuid.uuid4().hex[:6]}@test"
    env = {**os.environ, "REDIS_URL": url, "PYTHONPATH": str(tmp_path)}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "poolapp",
            "worker",
            "-Q",
            "slotrunner",
            "-n",
            name,
            "--pool",
            "solo",
            "--without-mingle",
            "--without-gossip",
            "--loglevel",
            "WARNING",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    app = celery.Celery(broker=url, set_as_current=False)
    try:
        wait_for(lambda: any(name in r for r in app.control.ping(timeout=0.5)), "the worker", 90)
        log = tmp_path / "log.jsonl"
        append(log, lease_line("A", 1), result_line("B", 1, "B:1", receipt_job="B"))
        result = CliRunner().invoke(
            ops,
            [
                "detect",
                "--stop-pool",
                "--webhook",
                receiver.url,
                "--state-dir",
                str(tmp_path / "st"),
                str(log),
            ],
            env={"REDIS_URL": url},
        )
        assert result.exit_code == 1, result.output
        queues = app.control.inspect(destination=[name], timeout=5).active_queues() or {}
    finally:
        app.close()
        worker.terminate()
        worker.wait(30)
        server.leave()
    assert "pool stopped" in receiver.alerts[0]["annotations"]["pool"]
    assert name in receiver.alerts[0]["annotations"]["pool"]
    assert queues.get(name) == []
