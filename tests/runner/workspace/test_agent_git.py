"""The agent's git inside the sandbox, and the fence around it (docs/architecture.md
§Agent git): real git, real bwrap, the slot's own layout (``slot_layout``), the run path
``run_tests`` takes."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from runner.core.git import git_text, run_git
from runner.core.settings import SandboxMode, Settings
from runner.workspace.cache import mirror_of
from runner.workspace.workspaces import Prepared, Workspaces
from tests.support.repos import make_repo
from tools import builtin
from tools.sandbox import run as sandbox
from tools.sandbox.layout import slot_layout

FILES = {"README": "sample\n", "pkg/lock.py": "held_by = None\n"}
HOOKS = (
    "pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "post-checkout",
    "post-merge", "post-rewrite", "post-index-change", "reference-transaction",
    "pre-auto-gc", "pre-push", "fsmonitor-watchman",
)  # fmt: skip


@pytest.fixture(autouse=True)
def _no_host_git_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return (tmp_path / "home").resolve()


@pytest.fixture
def ws(home: Path) -> Workspaces:
    return Workspaces(home)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "src"
    make_repo(path, FILES)
    return path


@pytest.fixture
def markers(home: Path) -> Path:
    # Under the home, which every sandbox shows empty: only a git process on the host,
    # one of the runner's, could ever write here.
    path = home / "markers"
    path.mkdir(parents=True)
    return path


def inside(home: Path, slot: Path, script: str, mode: SandboxMode = "required") -> str:
    """Run ``script`` with bash in the slot's sandbox; its stdout (stderr on failure)."""
    layout = slot_layout(slot, home)
    result = sandbox.run(["bash", "-c", script], layout.work, mode=mode, hide=[home], layout=layout)
    assert result.mode == ("bwrap" if mode == "required" else "none")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def hook(markers: Path, name: str) -> str:
    """A hook or command that leaves a marker on the host if the host ever runs it."""
    return f"{{ echo {name} >> {markers}/{name}; }} 2>/dev/null; echo {name} >> /slot/git/agent-ran"


def host_tree(tmp_path: Path, work: Path) -> str:
    """The tree id of ``work``'s files, made by hand in a plain repository elsewhere."""
    plain = tmp_path / "plain"
    subprocess.run(["cp", "-a", str(work), str(plain)], check=True)
    (plain / ".git").unlink()
    run_git("init", "-q", cwd=plain, check=True)
    run_git("add", "-A", cwd=plain, check=True)
    return git_text("write-tree", cwd=plain)


def prepare(ws: Workspaces, src: Path, slot: str, job: str) -> tuple[Path, Prepared]:
    slot_dir = ws.slots_dir / slot
    return slot_dir, ws.prepare(slot_dir, str(src), "main", job)


def test_the_agents_usual_git_commands_work_on_its_own_state(
    ws: Workspaces, src: Path, home: Path, tmp_path: Path
) -> None:
    """status, diff, add -A, commit, stash, log inside the sandbox; the runner's worktree,
    cache and snapshots do not move, and the end tree is the files' own tree."""
    slot, prepared = prepare(ws, src, "S0", "job-1")
    cache = ws.cache_for(str(src))
    refs_before = git_text("for-each-ref", cwd=cache)
    out = inside(home, slot, """set -e
        echo "clean:[$(git status --porcelain)]"
        echo more >> README; echo new > new.txt
        git status --porcelain; git diff --stat | head -1
        git add -A; git commit -q -m agent-commit; echo "head:$(git rev-parse HEAD)"
        git log --format=%s
        echo wip >> README; git stash -q; git stash list | wc -l; cat README; git stash pop -q
        git status --porcelain
    """)  # fmt: skip
    lines = out.splitlines()
    assert lines[:4] == ["clean:[]", " M README", "?? new.txt", " README | 1 +"]
    head = lines[4].removeprefix("head:")
    assert lines[5:7] == ["agent-commit", "base"]
    assert lines[7:10] == ["1", "sample", "more"] and lines[10:] == [" M README"]
    agent_dir = slot / "agent.git"
    assert git_text("--git-dir", str(agent_dir), "rev-parse", "HEAD^") == prepared.base_commit
    # The agent's commit is in its own git dir only; the runner's side did not move.
    assert run_git("--git-dir", str(cache), "cat-file", "-e", head).returncode != 0
    assert run_git("--git-dir", str(mirror_of(cache)), "cat-file", "-e", head).returncode != 0
    admin = ws.trees.require_worktree(slot).admin
    assert git_text("--git-dir", str(admin), "rev-parse", "HEAD") == prepared.base_commit
    assert git_text("for-each-ref", cwd=cache) == refs_before
    _, end_tree = ws.snapshot(slot, "job-1", "end")
    assert end_tree == host_tree(tmp_path, slot / "work")


def test_run_tests_runs_the_agents_git_in_the_same_layout(
    ws: Workspaces, src: Path, home: Path
) -> None:
    """The run path of run_tests gives a test command the agent's own git too."""
    slot, prepared = prepare(ws, src, "S0", "job-1")
    command = "echo x > t.txt && git add -A && git commit -qm from-tests && git log --format=%s"
    builtin.write_job(
        slot, {"job_id": "job-1", "generation": 1, "test_command": ["bash", "-c", command]}
    )
    settings = Settings.from_env({"SLOTRUNNER_HOME": str(home), "SLOTRUNNER_SANDBOX": "required"})
    ctx = builtin.Context(slot, settings)
    result = builtin.run_tests(ctx, None, job_id="job-1", generation=1)
    assert (result["sandbox"], result["passed"]) == ("bwrap", True), result
    assert result["stdout"].splitlines() == ["from-tests", "base"]
    head = git_text("--git-dir", str(slot / "agent.git"), "rev-parse", "HEAD^")
    assert head == prepared.base_commit


def test_nothing_the_fence_protects_is_visible_or_writable_inside(
    ws: Workspaces, src: Path, home: Path
) -> None:
    """The cache, its snapshot refs and objects, another slot, the stamp, receipts, the
    mirror and the runner's .git file: unseen, or read-only; another job's snapshot
    objects cannot be read even through the agent's alternates."""
    other, _ = prepare(ws, src, "S1", "job-other")
    (other / "work" / "answer.txt").write_text("the other job's answer\n")
    _, other_end = ws.snapshot(other, "job-other", "end")
    secret = git_text("rev-parse", f"{other_end}:answer.txt", cwd=ws.cache_for(str(src)))
    slot, prepared = prepare(ws, src, "S0", "job-1")
    for name, text in (("stamp.json", "{}\n"), ("receipts.jsonl", "")):
        (slot / name).write_text(text)
    cache = ws.cache_for(str(src))
    dotgit = (slot / "work" / ".git").read_text()
    before = {
        "cache": git_text("for-each-ref", cwd=cache),
        "mirror": git_text("for-each-ref", cwd=mirror_of(cache)),
        "stamp": (slot / "stamp.json").read_text(),
        "other": sorted(p.name for p in (other / "work").iterdir()),
    }
    targets = [
        cache / "objects" / "x", cache / "refs" / "slotrunner" / "x", mirror_of(cache) / "x",
        other / "work" / "pwned", other / "agent.git" / "x", slot / "stamp.json",
        slot / "receipts.jsonl", home / "repos" / "x",
    ]  # fmt: skip
    script = "\n".join(
        [
            f"test -e {t} && echo SEEN {t}; (echo x > {t}) 2>/dev/null && echo WROTE {t}"
            for t in targets
        ]
        + [
            f"ls {home} 2>/dev/null | sed 's/^/LISTED /'",
            "(echo x > /slot/source-objects/x) 2>/dev/null && echo WROTE objects",
            "(echo 'gitdir: /tmp' > .git) 2>/dev/null && echo WROTE .git",
            "rm -f .git 2>/dev/null && echo REMOVED .git",
            "(mv README .git) 2>/dev/null && echo MOVED .git",
            f"git --git-dir {cache} update-ref refs/slotrunner/snapshots/job-1/start HEAD"
            " 2>/dev/null && echo REF",
            f"git cat-file -e {secret} 2>/dev/null && echo LEAK",
            f"git cat-file -e {other_end} 2>/dev/null && echo LEAK",
            f"git cat-file -e {prepared.base_commit} && echo base-readable",
            "git cat-file --batch-all-objects --batch-check | wc -l | sed 's/^/objects /'",
        ]
    )
    out = inside(home, slot, script)
    assert out.splitlines()[0] == "base-readable", out
    assert (slot / "work" / ".git").read_text() == dotgit
    assert before == {
        "cache": git_text("for-each-ref", cwd=cache),
        "mirror": git_text("for-each-ref", cwd=mirror_of(cache)),
        "stamp": (slot / "stamp.json").read_text(),
        "other": sorted(p.name for p in (other / "work").iterdir()),
    }
    assert (slot / "receipts.jsonl").read_text() == ""
    # What the agent can read is the source's own objects, and nothing else.
    mirror_count = run_git(
        "--git-dir", str(mirror_of(cache)), "cat-file", "--batch-all-objects", "--batch-check"
    ).stdout.count(b"\n")
    assert out.splitlines()[1] == f"objects {mirror_count}"


def test_hooks_config_attributes_and_refs_of_the_agent_never_run_in_the_runners_git(
    ws: Workspaces, src: Path, home: Path, markers: Path, tmp_path: Path
) -> None:
    """Hooks in its git dir, a hooksPath, fsmonitor, aliases, filter and diff drivers with
    .gitattributes, gpg, forged snapshot refs: live for the agent's git, inert for the
    runner's end snapshot, diff, restore, recycle and the git tools."""
    slot, prepared = prepare(ws, src, "S0", "job-1")
    cache = ws.cache_for(str(src))
    start = git_text("rev-parse", "refs/slotrunner/snapshots/job-1/start", cwd=cache)
    lines = ["set -e", "mkdir -p /slot/git/hooks ../agent.git/hooks2 2>/dev/null || true"]
    for name in HOOKS:
        body = f"#!/bin/sh\\n{hook(markers, name)}\\nexit 0\\n"
        lines.append(f"printf '{body}' > /slot/git/hooks/{name}; chmod +x /slot/git/hooks/{name}")
    lines += [
        "echo more >> README && git add -A && git commit -q -m agent-commit",
        f'git config core.fsmonitor "{hook(markers, "fsmonitor")}"',
        "git config core.hooksPath ../agent.git/hooks2",
        f'git config alias.stash "!{hook(markers, "alias")}"',
        f'git config filter.evil.clean "{hook(markers, "clean")}; cat"',
        f'git config filter.evil.smudge "{hook(markers, "smudge")}; cat"',
        "git config filter.evil.required true",
        f'git config diff.evil.textconv "{hook(markers, "textconv")}; cat"',
        f'git config diff.external "{hook(markers, "external")}"',
        "git config commit.gpgSign true",
        f'git config gpg.program "{hook(markers, "gpg")}"',
        "printf '* filter=evil diff=evil\\n' > .gitattributes; echo evil > evil.txt",
        "git add evil.txt .gitattributes",
        "for w in start end; do",
        "  git update-ref refs/slotrunner/snapshots/job-1/$w HEAD",
        "done",
        "git status --porcelain > /dev/null",
        "(echo 'gitdir: /slot/git' > .git) 2>/dev/null || echo kept-dotgit",
    ]
    assert inside(home, slot, "\n".join(lines)).splitlines() == ["kept-dotgit"]
    ran = (slot / "agent.git" / "agent-ran").read_text().split()
    assert {"pre-commit", "post-commit", "reference-transaction", "clean"} <= set(ran)
    # The runner's side: snapshots, diff, restore, the git tools, the next recycle.
    end_commit, end_tree = ws.snapshot(slot, "job-1", "end")
    assert end_tree == host_tree(tmp_path, slot / "work")
    assert git_text("rev-parse", f"{end_commit}^", cwd=cache) == prepared.base_commit
    assert git_text("rev-parse", "refs/slotrunner/snapshots/job-1/start", cwd=cache) == start
    assert "evil.txt" in ws.diff(slot, prepared.base_commit)
    assert ws.restore("job-1", "end", tmp_path / "restored") == end_tree
    assert ws.restore("job-1", "end", slot / "work") == end_tree
    ctx = builtin.Context(slot, Settings.from_env({"SLOTRUNNER_HOME": str(home)}))
    assert "evil.txt" in builtin.git_status(ctx, None)["status"]
    builtin.git_commit(ctx, SimpleNamespace(message="tool commit"))
    ws.prepare(slot, str(src), "main", "job-2")
    assert sorted(p.name for p in markers.iterdir()) == []


def test_a_planted_nested_repository_is_never_entered_by_the_runners_git(
    ws: Workspaces, src: Path, home: Path, markers: Path
) -> None:
    """A nested repo whose own config has a filter driver and fsmonitor: the runner's git
    (the git tools, the end snapshot, the recycle) never runs git inside it."""
    slot, _ = prepare(ws, src, "S0", "job-1")
    inside(home, slot, f"""set -e
        mkdir sub && cd sub && git init -q && echo x > x
        git config user.name nested && git config user.email nested@localhost
        git config filter.ev.clean "echo nested >> {markers}/nested; cat"
        git config core.fsmonitor "echo nested-fsmonitor >> {markers}/nested-fsmonitor"
        echo '* filter=ev' > .gitattributes && git add -A && git commit -q -m nested
    """)  # fmt: skip
    ctx = builtin.Context(slot, Settings.from_env({"SLOTRUNNER_HOME": str(home)}))
    builtin.git_commit(ctx, SimpleNamespace(message="records the gitlink"))
    (slot / "work" / "sub" / "x").touch()  # stat-dirty: a status inside would re-hash it
    assert "sub" not in builtin.git_status(ctx, None)["status"]
    builtin.git_commit(ctx, SimpleNamespace(message="again, the gitlink in the index"))
    ws.snapshot(slot, "job-1", "end")
    assert list(markers.iterdir()) == []
    # The trap was armed: a git without the runner's pins runs the nested repo's driver.
    (slot / "work" / "sub" / "x").write_text("y\n")
    subprocess.run(["git", "status", "--porcelain"], cwd=slot / "work", capture_output=True)
    assert (markers / "nested").exists()
    for armed in markers.iterdir():
        armed.unlink()
    ws.prepare(slot, str(src), "main", "job-2")
    assert not (slot / "work" / "sub").exists() and list(markers.iterdir()) == []


def test_the_next_job_in_the_slot_starts_with_a_fresh_agent_git(
    ws: Workspaces, src: Path, home: Path
) -> None:
    """Commits, stash, branches, tags, hooks, config and refs of one job are gone for the
    next one; its HEAD and index are the base, its status clean."""
    slot, prepared = prepare(ws, src, "S0", "job-1")
    inside(home, slot, """set -e
        echo a >> README && git commit -q -am one && git checkout -q -b feature
        echo b >> README && git stash -q && git tag v1 && git config alias.st status
        mkdir -p /slot/git/hooks && printf '#!/bin/sh\\nexit 1\\n' > /slot/git/hooks/pre-commit
        chmod +x /slot/git/hooks/pre-commit
        git update-ref refs/slotrunner/snapshots/job-2/start HEAD
    """)  # fmt: skip
    _, second = prepare(ws, src, "S0", "job-2")
    out = inside(home, slot, """
        git rev-parse HEAD; git log --format=%s; echo "refs:[$(git for-each-ref)]"
        echo "stash:[$(git stash list)]"; echo "alias:[$(git config alias.st)]"
        echo "status:[$(git status --porcelain)]"; ls /slot/git/hooks 2>/dev/null | wc -l
        echo new > n.txt && git add -A && git commit -q -m two && echo committed
    """)  # fmt: skip
    assert out.splitlines() == [
        second.base_commit, "base", "refs:[]", "stash:[]", "alias:[]", "status:[]", "0",
        "committed",
    ]  # fmt: skip
    assert second.base_commit == prepared.base_commit


def test_a_layout_that_is_not_exactly_ours_gives_no_git_binds(
    ws: Workspaces, src: Path, home: Path, tmp_path: Path
) -> None:
    """source-objects must lead to a mirror's objects under repos/: pointing at the cache
    (snapshot objects), another path, or a missing agent git dir binds nothing of git."""
    slot, _ = prepare(ws, src, "S0", "job-1")
    layout = slot_layout(slot, home)
    assert [(b.dest, b.writable) for b in layout.binds] == [
        ("/slot/git", True), ("/slot/source-objects", False), ("/slot/work/.git", False),
    ]  # fmt: skip
    assert layout.hide == (home,) and layout.work == slot / "work"
    link = slot / "source-objects"
    cache = ws.cache_for(str(src))
    for target in (cache / "objects", tmp_path, home / "repos"):
        link.unlink()
        link.symlink_to(target)
        assert [b.dest for b in slot_layout(slot, home).binds] == ["/slot/work/.git"]
    link.unlink()
    link.symlink_to(mirror_of(cache) / "objects")
    (slot / "agent.gitfile").unlink()
    assert slot_layout(slot, home).binds[-1].source == Path("/dev/null")
    (slot / "agent.git").rename(slot / "elsewhere")
    assert [b.dest for b in slot_layout(slot, home).binds] == ["/slot/work/.git"]


def test_binds_come_after_the_work_tree() -> None:
    """A bind may cover a path in the tree (its .git), so it is mounted after the tree."""
    from tools.sandbox.policy import Bind, bwrap_argv

    binds = [Bind(Path("/h/agent.git"), "/slot/git", True), Bind(Path("/h/f"), "/slot/work/.git")]
    argv = bwrap_argv("bwrap", Path("/h/work"), {}, [Path("/h")], [], binds)
    work_at = argv.index("/slot/work")
    assert argv[work_at - 2 : work_at] == ["--bind", "/h/work"]
    assert argv[work_at + 1 : work_at + 7] == [
        "--bind", "/h/agent.git", "/slot/git", "--ro-bind", "/h/f", "/slot/work/.git",
    ]  # fmt: skip


def test_a_cache_from_before_the_mirror_keeps_its_snapshots_and_borrows_from_a_new_one(
    ws: Workspaces, src: Path, home: Path
) -> None:
    """A host upgraded with repos/<key>.git holding the source itself: the next prepare
    clones the mirror beside it, the old snapshots stay restorable, the agent's git
    borrows from the mirror only."""
    slot, first = prepare(ws, src, "S0", "job-old")
    cache = ws.cache_for(str(src))
    # What an old host had: the source's objects in the cache itself, no mirror.
    run_git("--git-dir", str(cache), "fetch", "-q", str(src), "+refs/heads/*:refs/heads/*")
    run_git("--git-dir", str(cache), "repack", "-a", "-d", "-q", check=True)
    (cache / "objects" / "info" / "alternates").unlink()
    subprocess.run(["rm", "-rf", str(mirror_of(cache))], check=True)
    _, second = prepare(ws, src, "S0", "job-new")
    assert (mirror_of(cache) / "HEAD").is_file()
    alternates = (cache / "objects" / "info" / "alternates").read_text().splitlines()
    assert alternates == [f"../../{mirror_of(cache).name}/objects"]
    assert ws.restore("job-old", "start", home.parent / "old-start") == first.start_tree
    assert inside(home, slot, "git log --format=%s").splitlines() == ["base"]
    assert second.base_commit == first.base_commit
    # Every base a job used stays reachable in the mirror: a gc there cannot drop it.
    kept = f"refs/slotrunner/bases/{second.base_commit}"
    assert git_text("--git-dir", str(mirror_of(cache)), "rev-parse", kept) == second.base_commit
