"""The agent's git through ``exec`` on a real tool server and the real bwrap: its own
repository state works, and nothing it does reaches the runner's git, the cache, the
snapshot refs or the slot's next job (docs/architecture.md §Agent git)."""

from __future__ import annotations

from typing import Any

from runner.core.git import git_text
from runner.core.stamp import Stamp
from tests.support.execslots import Slots, run
from tests.support.toolserver import ToolServer


def shell(server: ToolServer, stamp: Stamp, key: str, command: str) -> dict[str, Any]:
    response = run(server.url, stamp, key, {"command": command})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["result"]
    assert result["sandbox"] == "bwrap" and result["exit_code"] == 0, result
    return result


def test_exec_runs_the_agents_git_and_none_of_it_reaches_the_runner(
    toolserver: ToolServer, slots: Slots
) -> None:
    """status/diff/add -A/commit/stash/log work in exec; a hook, fsmonitor, filter driver
    and forged snapshot refs never run in (or change) the runner's snapshots; the cache
    cannot be written; the slot's next job starts from a fresh git state."""
    home = toolserver.settings.home
    markers = home / "markers"  # hidden in every sandbox: only the host can write here
    markers.mkdir()
    stamp = slots.lease("job-A")
    slot = slots.dir(stamp)
    cache = slots.workspaces.cache_for(str(slots.repo))
    start = git_text("rev-parse", "refs/slotrunner/snapshots/job-A/start", cwd=cache)
    mark = f"{{ echo ran >> {markers}/hook; }} 2>/dev/null; exit 0"
    out = shell(
        toolserver,
        stamp,
        "job-A:git",
        f"""set -e
        echo more >> README; echo new > new.txt
        git status --porcelain; git diff --stat | tail -1
        git add -A; git commit -q -m agent; git log --format=%s
        echo wip >> README; git stash -q; git stash list | wc -l; git stash pop -q
        mkdir -p /slot/git/hooks; printf '#!/bin/sh\\n{mark}\\n' > /slot/git/hooks/post-checkout
        cp /slot/git/hooks/post-checkout /slot/git/hooks/reference-transaction
        chmod +x /slot/git/hooks/*
        git config core.fsmonitor "{mark}"; git config filter.x.clean "{mark}; cat"
        echo '* filter=x' > .gitattributes
        git update-ref refs/slotrunner/snapshots/job-A/start HEAD
        (echo x > {cache}/objects/pwned) 2>/dev/null && echo WROTE-CACHE
        git --git-dir {cache} update-ref refs/slotrunner/snapshots/job-A/end HEAD 2>/dev/null \
            && echo WROTE-REF
        echo done
        """,
    )["output"]
    assert out.splitlines() == [
        " M README", "?? new.txt", " 1 file changed, 1 insertion(+)",
        "agent", "base", "1", "done",
    ], out  # fmt: skip
    _, end_tree = slots.workspaces.snapshot(slot, "job-A", "end")
    assert git_text("rev-parse", "refs/slotrunner/snapshots/job-A/start", cwd=cache) == start
    end = git_text("rev-parse", "refs/slotrunner/snapshots/job-A/end^{tree}", cwd=cache)
    assert end == end_tree and not (cache / "objects" / "pwned").exists()
    slots.release(stamp)
    again = slots.lease("job-B")
    assert again.slot_id == stamp.slot_id
    fresh = shell(
        toolserver,
        again,
        "job-B:git",
        'git log --format=%s; echo "[$(git stash list)][$(git for-each-ref)]"; '
        'echo "[$(git status --porcelain)][$(git config core.fsmonitor)]"',
    )["output"]
    assert fresh.splitlines() == ["base", "[][]", "[][]"]
    assert list(markers.iterdir()) == []
