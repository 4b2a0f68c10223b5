"""Several hosts, one pool, on the real stack: whole hosts die, freeze and come back.

Two hosts share the session's embedded Redis and one job queue; each has its own
home, token, tool server and workers in one process group (``tests/support/hosts.py``),
its tool server in a network namespace of its own where the machine allows it
(``tests/support/netns.py``). docs/architecture.md §Several hosts says what is attacked:
a job whose host is SIGKILLed whole moves to the other host as a new attempt and the
host comes back settled; a host frozen past the heartbeat comes back harmless, and the
same check fails when that host's fence is switched off through the test seam.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from runner.core.logs import EventLog
from runner.core.stamp import SlotState, read_stamp
from runner.slots.pool import SlotPool
from runner.slots.pool_view import HostView, read_pool
from runner.workspace.workspaces import Workspaces
from tests.support.hosts import Cluster, Host, group_pids, when
from tests.support.netns import Network, netns_unavailable
from tests.support.stack import gated_steps, wait_until
from tools.receipts.store import ReceiptStore
from tools.server.guard import TOKEN_HEADER


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    """Two addresses for the module's hosts: network namespaces here (root, ``ip netns``)."""
    net = Network(2)
    try:
        yield net
    finally:
        net.close()


def committed(c: Cluster, job_id: str) -> list[dict[str, Any]]:
    """The job's committed ``job_finished`` lines, on every host (it follows the commit)."""
    return [e for e in c.events("job_finished", job_id=job_id) if e["committed"]]


def views_of(host: HostView) -> set[tuple[str, str | None, int | None, str]]:
    return {(s.slot_id, s.job_id, s.attempt, s.state) for s in host.slots}


def calls(host: Host, job_id: str, attempt: int) -> list[dict[str, Any]]:
    return host.events("tool_result", job_id=job_id, attempt=attempt)


# -- off loopback, for real -----------------------------------------------------------


def test_each_tool_server_listens_off_loopback_and_takes_only_its_own_token(
    network: Network, redis_url: str, tmp_path: Path
) -> None:
    """In its own namespace each tool server requires its host's token: none, or another
    host's, is refused 401 before any tool runs; its own passes."""
    # Honest about the path taken: namespaces wherever this machine can make them.
    assert network.kind == ("loopback" if netns_unavailable() else "netns"), network.why_loopback
    with closing(Cluster(redis_url, tmp_path, network)) as c:
        c.start(workers=0)
        for host, other in ((c["a"], c["b"]), (c["b"], c["a"])):
            if network.kind == "netns":
                assert host.address.ip.startswith("10.231.") and host.address.netns
                assert host.server is not None and host.server.pid in network.pids(host.address)
            refused = {
                "error": "unauthorized",
                "message": f"missing or wrong {TOKEN_HEADER} header",
            }
            for headers in (
                {},
                {TOKEN_HEADER: other.token},
                {"authorization": f"Bearer {other.token}"},
            ):
                reply = httpx.get(f"{host.url}/healthz", headers=headers)
                assert (reply.status_code, reply.json()) == (401, refused), headers
                call = httpx.post(
                    f"{host.url}/v1/tools/write_file",
                    headers=headers,
                    json={"envelope": {}, "args": {"path": "x", "content": "x"}},
                )
                assert (call.status_code, call.json()) == (401, refused), headers
            own = httpx.get(f"{host.url}/healthz", headers={TOKEN_HEADER: host.token})
            assert own.status_code == 200 and own.json()["host"] == host.settings.host
            # The refused calls never reached a tool: no line for them in the host's log.
            assert host.events("tool_result") == []
        if network.kind == "netns":
            # And a server started off loopback without a token does not start at all.
            a = c["a"]
            started = subprocess.run(
                [
                    *a.address.prefix(),
                    *(sys.executable, "-m", "runner.cli.main", "toolserver"),
                    *("--host", a.address.ip, "--port", str(a.port + 1)),
                ],
                env=a.env(SLOTRUNNER_TOKEN=""),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert started.returncode == 2, started.stderr
            assert started.stderr.strip() == (
                f"error: refusing to listen on {a.address.ip} without a token: set SLOTRUNNER_TOKEN"
            )


def test_without_namespaces_the_hosts_share_loopback_at_ports_of_their_own(
    redis_url: str, tmp_path: Path
) -> None:
    """The fallback of a machine without root or ``ip netns``: no namespace is made, and
    each host's tool server gets its own port on 127.0.0.1 (and still its own token)."""
    net = Network(2, prefer_netns=False)
    assert (net.kind, net.why_loopback) == ("loopback", "loopback asked for")
    c = Cluster(redis_url, tmp_path, net)
    try:
        a, b = c["a"], c["b"]
        assert a.address.prefix() == [] and net.pids(a.address) == []
        assert a.url.startswith("http://127.0.0.1:") and a.port != b.port
        assert a.token != b.token and a.settings.host != b.settings.host
    finally:
        c.close()
        net.close()


# -- a job moves when its host dies ------------------------------------------------------


def test_jobs_move_when_their_host_dies_whole_and_the_host_comes_back_settled(
    network: Network, redis_url: str, tmp_path: Path
) -> None:
    """SIGKILL of every process of host a mid-job: its two jobs finish on host b as
    attempt 2, with a never restarted. Restarted on its home, a settles both old slots
    before it leases again, and nothing of an attempt 1 was applied after its attempt 2
    started."""
    jobs = ("dies-1", "dies-2")
    with closing(Cluster(redis_url, tmp_path, network, slots=2)) as c:
        a, b = c["a"], c["b"]
        c.start(workers=0)
        a.start_worker(concurrency=2)  # b's worker comes once a holds both jobs
        first = {}
        for job in jobs:
            c.submit(job, gated_steps())
        for job in jobs:
            host, slot = c.runs(job, 1)
            assert host is a, host.name
            c.gate_reached(a, slot)
            first[job] = a.events("slot_leased", job_id=job, attempt=1)[0]
        b.start_worker(concurrency=2)
        pgid = a.pgid
        assert pgid is not None and len(group_pids(pgid)) >= 4  # server, worker, 2 children
        a.kill()  # one SIGKILL to the group; returns once none of it is left

        # Never restarted: both jobs finish on b, each as a new attempt in a slot of b.
        for job in jobs:
            host, slot = c.runs(job, 2)
            assert host is b, host.name
            c.open_gate(b, slot)
        for job in jobs:
            result = c.result(job)
            assert (result.state, result.attempt) == ("succeeded", 2), result.reason
            lease = b.events("slot_leased", job_id=job, attempt=2)
            assert [(e["slot_id"], e["generation"]) for e in lease] == [
                (result.slot_id, result.generation)
            ]
            wait_until(f"{job}'s committed job_finished", partial(committed, c, job))
            assert [e["host"] for e in committed(c, job)] == [b.settings.host]
            # Each host's calls went to its own tool server, and only there.
            assert calls(a, job, 1) and calls(b, job, 2)
            assert calls(b, job, 1) == [] and calls(a, job, 2) == []

        # And the pool's view (``slots list --pool`` reads the same) shows a dead, its two
        # slots still as the kill left them: nothing but a itself settles them.
        def view_of_a() -> HostView | None:
            views = {v.host: v for v in read_pool(c.redis, datetime.now(UTC))}
            return views[a.settings.host] if views[a.settings.host].status == "dead" else None

        dead = wait_until("host a to show as dead", view_of_a)
        assert views_of(dead) == {(first[j]["slot_id"], j, 1, "leased") for j in jobs}
        assert {v.host: v.status for v in read_pool(c.redis, datetime.now(UTC))}[
            b.settings.host
        ] == "live"

        # Comes back on the same home; b's worker leaves, so the next job is a's.
        back = datetime.now(UTC)
        a.start(workers=1, concurrency=1, wait=False)
        b.stop_member(b.workers()[0])
        a.wait_healthy()
        reclaimed = {
            job: a.wait_event(
                f"{job}'s old slot to be settled", "slot_reclaimed", job_id=job, attempt=1
            )
            for job in jobs
        }
        c.submit("after-1", [{"tool": "write_file", "args": {"path": "n.md", "content": "n\n"}}])
        result = c.result("after-1")
        assert (result.state, result.attempt) == ("succeeded", 1), result.reason
        host, slot = c.runs("after-1", 1)
        assert host is a
        new_lease = a.events("slot_leased", job_id="after-1")[0]
        for job in jobs:
            old = first[job]
            settled = reclaimed[job]
            assert settled["reason"] == "superseded" and when(settled) > back
            assert settled["generation"] == old["generation"]
            assert settled["new_generation"] > old["generation"]
            # From its receipts: the run_tests the kill cut short is closed as not
            # applied by the janitor (the tool server's recovery, if it looks first,
            # leaves a not-applied intent open for a resend: one more line, no outcome).
            key = f"{job}:a1:s1:run_tests"
            cut = a.events("receipt_resolved", key=key, by="janitor")
            assert [e["resolution"] for e in cut] == ["not_applied"], cut
            assert settled["intents_not_applied"] == 1 and when(cut[0]) > back
            assert ReceiptStore(a.settings.slots_dir / old["slot_id"]).open_intents() == []
            if old["slot_id"] == slot:
                # Settled before the slot took a new lease, at a newer generation.
                assert when(cut[0]) < when(new_lease) and when(settled) < when(new_lease)
                assert new_lease["generation"] > settled["new_generation"]
            # Nothing of attempt 1 applied after attempt 2 started (on b, same clock).
            second = b.events("job_started", job_id=job, attempt=2)[0]
            late = [e for e in calls(a, job, 1) if when(e) > when(second)]
            assert late == [], late
            applied = [e for e in calls(a, job, 1) if e["outcome"] == "applied"]
            assert applied and all(when(e) < when(second) for e in applied)
            assert len(committed(c, job)) == 1


# -- a frozen host comes back harmless -------------------------------------------------


def frozen_host(c: Cluster, *, fence: bool) -> tuple[list[str], httpx.Response]:
    """Host a SIGSTOPped whole past the heartbeat while its job waits in ``run_tests``;
    the job moves to b and finishes; a is SIGCONTed, its slot goes back to the pool and
    is leased to another job; the zombie's next call is then sent as it would send it.

    Returns what broke the frozen-host promise (empty: nothing) and the reply to that
    call. The promise: every call of attempt 1 after the thaw is refused, or lands in
    its own (superseded) lease on a, never in a slot of another lease or host; and the
    job's committed result is attempt 2's.
    """
    a, b = c["a"], c["b"]
    tag = "fenced" if fence else "unfenced"
    job, other = f"frozen-{tag}", f"frozen-{tag}-other"
    a.start(workers=0, fence=fence, wait=False)
    b.start(workers=0, wait=False)
    a.start_worker()
    a.wait_healthy()
    b.wait_healthy()
    c.submit(job, gated_steps())
    host, slot = c.runs(job, 1)
    assert host is a, host.name
    lease = a.events("slot_leased", job_id=job, attempt=1)[0]
    c.gate_reached(a, slot)
    b.start_worker()
    a.signal(signal.SIGSTOP)
    try:
        moved, moved_slot = c.runs(job, 2)
        assert moved is b, moved.name
        c.open_gate(b, moved_slot)
        result = c.result(job)
        wait_until("the committed job_finished", lambda: committed(c, job))
        (a.work(slot) / "go").write_text("")  # the zombie's run_tests ends once it runs
        thawed = datetime.now(UTC)
    finally:
        a.signal(signal.SIGCONT)
    a.wait_event("the zombie to learn it was superseded", "job_superseded", job_id=job)
    wait_until(
        "a's slot back in the pool",
        lambda: (s := read_stamp(a.settings.slots_dir / slot)) and s.state == SlotState.IDLE,
    )
    # Another job takes the slot, as ``slotrunner slots lease --repo`` does.
    taken = SlotPool(a.settings, c.redis, EventLog(a.settings)).lease(other, 1)
    assert taken.slot_id == slot and taken.generation > lease["generation"]
    Workspaces(a.settings.home).prepare(a.work(slot).parent, str(c.repo), c.base, other)
    # The zombie's next step, write_file b, as its worker sends it.
    envelope = {
        "job_id": job,
        "attempt": 1,
        "slot_id": slot,
        "generation": lease["generation"],
        "tool": "write_file",
        "idempotency_key": f"{job}:a1:s2:write_file",
    }
    reply = httpx.post(
        f"{a.url}/v1/tools/write_file",
        headers={TOKEN_HEADER: a.token},
        json={"envelope": envelope, "args": {"path": "notes/b.md", "content": "zombie\n"}},
    )
    broken = []
    ended = [
        e
        for e in a.events("slot_released", job_id=job) + a.events("slot_reclaimed", job_id=job)
        if e["generation"] == lease["generation"]
    ]
    assert len(ended) == 1, ended
    for call in calls(a, job, 1):
        if when(call) < thawed or call["outcome"] == "refused":
            continue
        if call["slot_id"] != slot or call["slot_generation"] != lease["generation"]:
            broken.append(f"attempt 1 applied outside its lease: {call}")
        elif when(call) > when(ended[0]):
            leased = a.events("slot_leased", slot_id=slot)
            holders = [e["job_id"] for e in leased if when(e) < when(call)]
            broken.append(f"attempt 1 {call['outcome']} after its lease ended, in {holders[-1]}'s")
    broken += [f"attempt 1 called b's tool server: {e}" for e in calls(b, job, 1)]
    if (a.work(slot) / "notes" / "b.md").exists():
        broken.append(f"the zombie's write is in {other}'s tree")
    if (result.state, result.attempt) != ("succeeded", 2) or len(committed(c, job)) != 1:
        broken.append(f"the committed result is not attempt 2's alone: {result}")
    if [e["committed"] for e in a.events("job_finished", job_id=job, attempt=1)] != [False]:
        broken.append("attempt 1 committed a result")
    return broken, reply


def test_a_frozen_host_comes_back_harmless(
    network: Network, redis_url: str, tmp_path: Path
) -> None:
    """SIGSTOP of host a past the heartbeat, SIGCONT after its job finished on b: the
    zombie's late call is refused, and attempt 1 never commits."""
    with closing(Cluster(redis_url, tmp_path, network)) as c:
        broken, reply = frozen_host(c, fence=True)
        assert broken == []
        assert reply.status_code == 409 and reply.json()["error"] == "slot_job_mismatch"


def test_the_frozen_host_check_fails_when_the_fence_is_off(
    network: Network, redis_url: str, tmp_path: Path
) -> None:
    """The same scenario with a's fence switched off through the test seam
    (``ops.testing.toolserver --fence off``): the zombie's late call lands in the tree of
    the job now leasing its old slot, and the check above says so."""
    with closing(Cluster(redis_url, tmp_path, network)) as c:
        broken, reply = frozen_host(c, fence=False)
        assert reply.status_code == 200, reply.text
        assert broken == [
            "attempt 1 applied after its lease ended, in frozen-unfenced-other's",
            "the zombie's write is in frozen-unfenced-other's tree",
        ]
