"""Slot work trees and snapshots against real git repositories made in tmp_path."""

from __future__ import annotations

import multiprocessing
import os
import queue
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from runner.core.git import run_git
from runner.workspace.cache import BASE_REFS, mirror_of
from runner.workspace.git import WorkspaceError
from runner.workspace.workspaces import Prepared, Workspaces

IDENTITY = ("-c", "user.name=Test", "-c", "user.email=test@example.com")


@pytest.fixture(autouse=True)
def no_git_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run every test (and the processes it spawns) as on a host with no git config."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *IDENTITY, *args], cwd=cwd, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def make_repo(path: Path) -> str:
    """A repo with a subdir, an ignore file, a tracked-but-ignored file, +x, a symlink."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("hello\n")
    (path / "src").mkdir()
    (path / "src" / "app.py").write_text("print('hi')\n")
    (path / ".gitignore").write_text("build/\n*.log\n")
    (path / "keep.log").write_text("tracked although ignored\n")
    (path / "run.sh").write_text("#!/bin/sh\necho ok\n")
    (path / "run.sh").chmod(0o755)
    (path / "data.bin").write_bytes(bytes(range(256)))
    (path / "link").symlink_to("README.md")
    git(path, "add", "-A")
    git(path, "add", "-f", "keep.log")
    git(path, "commit", "-q", "-m", "init")
    return git(path, "rev-parse", "HEAD")


def commit_file(repo: Path, name: str, text: str) -> str:
    (repo / name).write_text(text)
    git(repo, "add", name)
    git(repo, "commit", "-q", "-m", f"add {name}")
    return git(repo, "rev-parse", "HEAD")


def apply_change(tree: Path) -> None:
    """One job's edits: modify, delete, add (untracked), mode change, symlink, ignored."""
    (tree / "README.md").write_text("hello, changed\n")
    (tree / "src" / "app.py").unlink()
    (tree / "notes").mkdir()
    (tree / "notes" / "todo.txt").write_text("write tests\n")
    (tree / "run.sh").chmod(0o644)
    (tree / "latest").symlink_to("notes/todo.txt")
    (tree / "build").mkdir()
    (tree / "build" / "out.o").write_bytes(b"\x00object")
    (tree / "debug.log").write_text("noise\n")


def files(root: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple[str, bytes]]:
    """Every file under root (not .git) as kind + bytes: 'link' target, 'exec' or 'file'."""
    out: dict[str, tuple[str, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) == root and d == ".git")]
        for name in [*filenames, *(d for d in dirnames if (Path(dirpath) / d).is_symlink())]:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel == ".git" or rel.startswith(skip):
                continue
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path).encode())
            else:
                kind = "exec" if path.stat().st_mode & 0o100 else "file"
                out[rel] = (kind, path.read_bytes())
    return out


IGNORED = ("build/", "debug.log")


@pytest.fixture
def src(tmp_path: Path) -> Path:
    make_repo(tmp_path / "src")
    return tmp_path / "src"


@pytest.fixture
def ws(tmp_path: Path) -> Workspaces:
    return Workspaces(tmp_path / "home")


def slot(ws: Workspaces, slot_id: str) -> Path:
    return ws.home / "slots" / slot_id


def base_of(src: Path) -> str:
    return git(src, "rev-parse", "HEAD")


def test_cache_is_cloned_once_and_reused(ws: Workspaces, src: Path) -> None:
    """A second prepare (same or other slot) reuses the cache: no new clone, no fetch."""
    base = base_of(src)
    first = ws.prepare(slot(ws, "s1"), str(src), base, "job-1")
    cache = ws.cache_for(str(src))
    inode = cache.stat().st_ino
    (cache / "marker-from-test").write_text("still here")
    ws.prepare(slot(ws, "s1"), str(src), base, "job-2")
    ws.prepare(slot(ws, "s2"), str(src), base, "job-3")
    assert cache.stat().st_ino == inode
    assert (cache / "marker-from-test").exists()
    assert not (cache / "FETCH_HEAD").exists()  # a commit id already cached needs no fetch
    assert list(ws.repos_dir.glob("*.git")) == [cache]
    assert cache.name == f"{first.repo_key}.git"
    assert first.base_commit == base


def test_a_known_base_commit_is_recycled_to_without_asking_git_for_it(
    ws: Workspaces, src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Job after job at the same commit id, git is asked nothing about the commit: it is
    resolved from its kept base ref and its tree id is remembered. The recycle still
    leaves the tree pristine at that tree: a file the last job left is gone."""
    base = base_of(src)
    first = ws.prepare(slot(ws, "s1"), str(src), base, "job-1")
    lines: list[tuple[str, ...]] = []

    def recorded(
        *args: str, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        lines.append(args)
        return run_git(*args, env=env)

    # Every git call of the workspace layers goes through runner.workspace.git's run_git.
    monkeypatch.setattr("runner.workspace.git.run_git", recorded)
    work = slot(ws, "s1") / "work"
    (work / "left-by-job-1.txt").write_text("x\n")
    second = ws.prepare(slot(ws, "s1"), str(src), base, "job-2")
    assert second.base_commit == first.base_commit == base
    assert second.start_tree == first.start_tree == git(src, "rev-parse", "HEAD^{tree}")
    assert not (work / "left-by-job-1.txt").exists()
    assert lines, "the recycle itself still runs git"
    assert not [args for args in lines if "rev-parse" in args], lines

    # The shortcut stands on the kept ref: without it the commit is looked up again.
    ref = mirror_of(ws.cache_for(str(src))) / BASE_REFS / base
    assert ref.is_file()
    ref.unlink()
    lines.clear()
    third = ws.prepare(slot(ws, "s1"), str(src), base, "job-3")
    assert third.base_commit == base
    assert [args for args in lines if "rev-parse" in args]
    assert ref.is_file()  # kept again


def test_branch_base_follows_the_source(ws: Workspaces, src: Path) -> None:
    """A branch name is fetched again: the second job gets the branch's new commit."""
    first = ws.prepare(slot(ws, "s1"), str(src), "main", "job-1")
    newer = commit_file(src, "later.txt", "later\n")
    second = ws.prepare(slot(ws, "s1"), str(src), "main", "job-2")
    assert first.base_commit != newer
    assert second.base_commit == newer
    assert (slot(ws, "s1") / "work" / "later.txt").read_text() == "later\n"


def test_missing_commits_are_fetched(ws: Workspaces, src: Path) -> None:
    """Commits made after the clone (on a new branch, or on no branch) are fetched."""
    ws.prepare(slot(ws, "s1"), str(src), "main", "job-1")
    git(src, "checkout", "-q", "-b", "feature")
    feature = commit_file(src, "feature.txt", "f\n")
    orphan = commit_file(src, "pr.txt", "pr\n")
    git(src, "update-ref", "refs/pull/1/head", orphan)
    git(src, "reset", "-q", "--hard", feature)  # `orphan` is now on no branch
    assert ws.prepare(slot(ws, "s1"), str(src), feature, "job-2").base_commit == feature
    assert ws.prepare(slot(ws, "s1"), str(src), "refs/pull/1/head", "job-3").base_commit == orphan
    assert (slot(ws, "s1") / "work" / "pr.txt").exists()


def test_worktree_is_reused_and_a_dirty_tree_reset(ws: Workspaces, src: Path) -> None:
    """The next job reuses the worktree, back at base: edits, new, ignored files, commits gone."""
    base = base_of(src)
    pristine = files(src)
    ws.prepare(slot(ws, "s1"), str(src), base, "job-1")
    work = slot(ws, "s1") / "work"
    cache = ws.cache_for(str(src))
    dotgit = (work / ".git").read_text()
    worktrees = git(cache, "worktree", "list", "--porcelain")
    apply_change(work)
    (work / "nested").mkdir()
    git(work / "nested", "init", "-q")  # a repository inside the tree
    git(work, "add", "notes/todo.txt")
    git(work, "commit", "-q", "-m", "agent commit")  # HEAD moved by the job
    (work / "staged.txt").write_text("staged\n")
    git(work, "add", "staged.txt")

    prepared = ws.prepare(slot(ws, "s1"), str(src), base, "job-2")

    assert (work / ".git").read_text() == dotgit
    assert git(cache, "worktree", "list", "--porcelain") == worktrees
    assert files(work) == pristine
    assert git(work, "rev-parse", "HEAD") == base
    assert git(work, "status", "--porcelain", "--ignored", "--untracked-files=all") == ""
    assert prepared.start_tree == git(src, "rev-parse", "HEAD^{tree}")


def test_a_planted_nested_dotgit_does_not_carry_files_to_the_next_job(
    ws: Workspaces, src: Path
) -> None:
    """A `.git` file planted in a tracked directory (what run_tests could do) would make
    git skip that directory; the recycle removes it and the next tree is pristine."""
    base = base_of(src)
    pristine = files(src)
    ws.prepare(slot(ws, "s1"), str(src), base, "job-1")
    work = slot(ws, "s1") / "work"
    tracked_dir = next(
        p.parent
        for p in sorted(work.rglob("*"))
        if p.is_file() and p.parent != work and ".git" not in p.relative_to(work).parts
    )
    (tracked_dir / ".git").write_text("gitdir: /nowhere\n")
    (tracked_dir / "left-for-the-next-job.txt").write_text("leak\n")
    deep = work / "newdir" / "inner"
    deep.mkdir(parents=True)
    (deep / ".git").mkdir()
    (deep / "also-left.txt").write_text("leak\n")

    prepared = ws.prepare(slot(ws, "s1"), str(src), base, "job-2")

    assert files(work) == pristine
    assert prepared.start_tree == git(src, "rev-parse", "HEAD^{tree}")


def test_recycling_between_two_bases_is_exact_and_in_place(ws: Workspaces, src: Path) -> None:
    """Job after job across two bases: the same work dir, at its base, nothing left over."""
    first = base_of(src)
    commit_file(src, "added.txt", "only in the second base\n")
    git(src, "rm", "-q", "data.bin")
    git(src, "commit", "-q", "-m", "drop data.bin")
    second = git(src, "rev-parse", "HEAD")
    expected = {}
    for base in (first, second):
        git(src, "checkout", "-q", "--detach", base)
        expected[base] = files(src)
    work = slot(ws, "s1") / "work"
    ws.prepare(slot(ws, "s1"), str(src), first, "job-0")
    inode = work.stat().st_ino
    for i, base in enumerate([second, first, second, second, first], start=1):
        apply_change(work)
        prepared = ws.prepare(slot(ws, "s1"), str(src), base, f"job-{i}")
        assert files(work) == expected[base]
        assert git(work, "rev-parse", "HEAD") == base
        assert git(work, "status", "--porcelain", "--ignored", "--untracked-files=all") == ""
        assert prepared.start_tree == git(src, "rev-parse", f"{base}^{{tree}}")
        assert work.stat().st_ino == inode  # recycled in place, never rebuilt


def test_work_holds_only_the_checkout(ws: Workspaces, src: Path) -> None:
    """work/ contains the checkout and the worktree's .git file, nothing of slotrunner's."""
    ws.prepare(slot(ws, "s1"), str(src), "main", "job-1")
    work = slot(ws, "s1") / "work"
    assert sorted(p.name for p in work.iterdir()) == sorted(
        [".git", *(p.name for p in src.iterdir() if p.name != ".git")]
    )
    assert (work / ".git").is_file()


def test_snapshot_includes_untracked_files_and_leaves_the_index(ws: Workspaces, src: Path) -> None:
    """`end` holds edits and untracked files, no ignored ones; index and HEAD untouched."""
    prepared = ws.prepare(slot(ws, "s1"), str(src), "main", "job-1")
    work = slot(ws, "s1") / "work"
    apply_change(work)
    index = Path(git(work, "rev-parse", "--path-format=absolute", "--git-path", "index"))
    index_bytes = index.read_bytes()
    status = git(work, "status", "--porcelain")

    commit, tree = ws.snapshot(slot(ws, "s1"), "job-1", "end")

    cache = ws.cache_for(str(src))
    names = git(cache, "ls-tree", "-r", "--name-only", commit).splitlines()
    assert "notes/todo.txt" in names and "latest" in names
    assert "keep.log" in names  # tracked by the base although *.log is ignored
    assert "build/out.o" not in names and "debug.log" not in names
    assert "src/app.py" not in names
    assert git(cache, "rev-parse", "refs/slotrunner/snapshots/job-1/end") == commit
    assert git(cache, "rev-parse", f"{commit}^{{tree}}") == tree
    assert git(cache, "rev-parse", f"{commit}^1") == prepared.base_commit
    assert index.read_bytes() == index_bytes
    assert git(work, "status", "--porcelain") == status
    assert git(work, "rev-parse", "HEAD") == prepared.base_commit


def test_final_tree_equals_the_same_change_made_by_hand(
    ws: Workspaces, src: Path, tmp_path: Path
) -> None:
    """The `end` tree id is the one `git add -A && git write-tree` gives in a plain clone."""
    prepared = ws.prepare(slot(ws, "s1"), str(src), "main", "job-1")
    apply_change(slot(ws, "s1") / "work")
    _, final_tree = ws.snapshot(slot(ws, "s1"), "job-1", "end")

    manual = tmp_path / "manual"
    git(tmp_path, "clone", "-q", str(src), str(manual))
    git(manual, "checkout", "-q", "--detach", prepared.base_commit)
    apply_change(manual)
    git(manual, "add", "-A")
    assert git(manual, "write-tree") == final_tree


def test_restore_into_a_fresh_directory_is_exact(ws: Workspaces, src: Path, tmp_path: Path) -> None:
    """Restoring `end` and `start` into new directories gives their tree ids and bytes."""
    prepared = ws.prepare(slot(ws, "s1"), str(src), "main", "job-1")
    work = slot(ws, "s1") / "work"
    apply_change(work)
    _, end_tree = ws.snapshot(slot(ws, "s1"), "job-1", "end")

    assert ws.restore("job-1", "end", tmp_path / "out-end") == end_tree
    assert files(tmp_path / "out-end") == files(work, skip=IGNORED)
    assert ws.restore("job-1", "start", tmp_path / "out-start") == prepared.start_tree
    assert files(tmp_path / "out-start") == files(src)


def test_restore_into_the_slot_after_reuse(ws: Workspaces, src: Path) -> None:
    """After the slot moved on to another job, restore puts job-1's `end` back exactly."""
    first = ws.prepare(slot(ws, "s1"), str(src), "main", "job-1")
    work = slot(ws, "s1") / "work"
    apply_change(work)
    _, end_tree = ws.snapshot(slot(ws, "s1"), "job-1", "end")
    expected = files(work, skip=IGNORED)
    ws.prepare(slot(ws, "s1"), str(src), "main", "job-2")
    (work / "job2.txt").write_text("job 2 was here\n")

    assert ws.restore("job-1", "end", work) == end_tree
    assert files(work) == expected
    assert git(work, "rev-parse", "HEAD") == first.base_commit  # job-1's view: base + changes
    assert ws.restore("job-1", "start", work) == first.start_tree
    assert files(work) == files(src)


def test_restore_refuses_a_non_empty_directory_and_unknown_jobs(
    ws: Workspaces, src: Path, tmp_path: Path
) -> None:
    """Restore never writes over an arbitrary directory, and names a missing snapshot."""
    ws.prepare(slot(ws, "s1"), str(src), "main", "job-1")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "precious.txt").write_text("mine\n")
    with pytest.raises(WorkspaceError, match="not empty"):
        ws.restore("job-1", "start", busy)
    assert (busy / "precious.txt").read_text() == "mine\n"
    with pytest.raises(WorkspaceError, match="no 'end' snapshot of job 'job-1'"):
        ws.restore("job-1", "end", tmp_path / "out")
    with pytest.raises(WorkspaceError, match="no 'start' snapshot of job 'nobody'"):
        ws.restore("nobody", "start", tmp_path / "out")
    with pytest.raises(WorkspaceError, match="expected one of start, end"):
        ws.restore("job-1", "middle", tmp_path / "out")


def test_find_snapshot(ws: Workspaces, src: Path) -> None:
    """find_snapshot names the cache, commit and tree of a snapshot, None when absent."""
    prepared = ws.prepare(slot(ws, "s1"), str(src), "main", "job-1")
    assert ws.find_snapshot("job-1", "start") == (
        ws.cache_for(str(src)),
        prepared.start_commit,
        prepared.start_tree,
    )
    assert ws.find_snapshot("job-1", "end") is None
    assert ws.find_snapshot("job-9", "start") is None


def test_diff_covers_untracked_files_and_applies(ws: Workspaces, src: Path, tmp_path: Path) -> None:
    """The diff against base includes new files; applied to base it gives the `end` tree."""
    prepared = ws.prepare(slot(ws, "s1"), str(src), "main", "job-1")
    apply_change(slot(ws, "s1") / "work")
    _, end_tree = ws.snapshot(slot(ws, "s1"), "job-1", "end")
    patch = ws.diff(slot(ws, "s1"), prepared.base_commit)
    assert "new file mode 100644" in patch and "+write tests" in patch
    assert "out.o" not in patch

    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", str(src), str(other))
    (tmp_path / "job.patch").write_text(patch)
    git(other, "apply", str(tmp_path / "job.patch"))
    git(other, "add", "-A")
    assert git(other, "write-tree") == end_tree


def test_unknown_base_is_a_clear_error(ws: Workspaces, src: Path) -> None:
    """A base that names nothing in the source is refused, naming the base."""
    with pytest.raises(WorkspaceError, match=r"unknown base 'no-such-branch'"):
        ws.prepare(slot(ws, "s1"), str(src), "no-such-branch", "job-1")
    with pytest.raises(WorkspaceError, match=f"unknown base '{'0' * 40}'"):
        ws.prepare(slot(ws, "s1"), str(src), "0" * 40, "job-1")
    with pytest.raises(WorkspaceError, match="not a commit-ish"):
        ws.prepare(slot(ws, "s1"), str(src), "--upload-pack=touch", "job-1")


def test_bad_repo_is_a_clear_error(ws: Workspaces, tmp_path: Path) -> None:
    """A missing path, a plain directory, or a forbidden URL scheme is refused by name."""
    with pytest.raises(WorkspaceError, match="does not exist"):
        ws.prepare(slot(ws, "s1"), str(tmp_path / "nowhere"), "main", "job-1")
    (tmp_path / "plain").mkdir()
    with pytest.raises(WorkspaceError, match="is not a git repository"):
        ws.prepare(slot(ws, "s1"), str(tmp_path / "plain"), "main", "job-1")
    with pytest.raises(WorkspaceError, match="scheme 'ext' not allowed"):
        ws.prepare(slot(ws, "s1"), "ext::sh -c touch% /tmp/pwned", "main", "job-1")
    with pytest.raises(WorkspaceError, match="neither a path nor a URL"):
        ws.prepare(slot(ws, "s1"), "--upload-pack=x", "main", "job-1")


@pytest.mark.parametrize(
    "job_id",
    [
        "",
        "a b",
        "a..b",
        "x/y",
        "a~1",
        "a:b",
        "a^b",
        "a*",
        "x.lock",
        ".hidden",
        "a\x00b",
        "a@{1}",
        "tab\tid",
        "x" * 201,
    ],
)
def test_bad_job_id_is_refused(ws: Workspaces, src: Path, job_id: str) -> None:
    """A job id that cannot name a ref is refused before anything is cloned or written."""
    with pytest.raises(WorkspaceError, match=r"job id .* cannot be used"):
        ws.prepare(slot(ws, "s1"), str(src), "main", job_id)
    assert not ws.repos_dir.exists()
    with pytest.raises(WorkspaceError, match=r"job id .* cannot be used"):
        ws.find_snapshot(job_id, "start")


def test_good_job_ids_are_accepted(ws: Workspaces, src: Path) -> None:
    """Ordinary ids (uuid, dotted, dashed, underscored) work."""
    for job_id in ["3f2a9c1e-0b7d-4e55-9a51-0c4d2b8e7f10", "run_2024.06.01", "J-1"]:
        prepared = ws.prepare(slot(ws, "s1"), str(src), "main", job_id)
        assert isinstance(prepared, Prepared)


def test_cache_keys(
    ws: Workspaces, src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two spellings of one path share a cache; two repos with one name never do."""
    monkeypatch.chdir(tmp_path)
    assert ws.cache_for("src") == ws.cache_for(str(src)) == ws.cache_for(f"{src}/")
    make_repo(tmp_path / "a" / "proj")
    make_repo(tmp_path / "b" / "proj")
    one, two = (
        ws.cache_for(str(tmp_path / "a" / "proj")),
        ws.cache_for(str(tmp_path / "b" / "proj")),
    )
    assert one != two
    assert one.name.startswith("proj-") and two.name.startswith("proj-")
    url = ws.cache_for(f"file://{src}")
    assert url.name.endswith(".git") and "-src-" in url.name and url != ws.cache_for(str(src))


def test_url_source(ws: Workspaces, src: Path) -> None:
    """A file:// URL is cloned like any remote and prepared the same way."""
    prepared = ws.prepare(slot(ws, "s1"), f"file://{src}", "main", "job-1")
    assert prepared.start_tree == git(src, "rev-parse", "HEAD^{tree}")


def test_slot_moves_to_another_repo(ws: Workspaces, src: Path, tmp_path: Path) -> None:
    """A slot switching repos leaves the old cache's worktree list and joins the new one."""
    ws.prepare(slot(ws, "s1"), str(src), "main", "job-1")
    other = tmp_path / "other"
    make_repo(other)
    commit_file(other, "other.txt", "other\n")
    work = slot(ws, "s1") / "work"
    ws.prepare(slot(ws, "s1"), str(other), "main", "job-2")
    assert str(work) not in git(ws.cache_for(str(src)), "worktree", "list", "--porcelain")
    assert str(work) in git(ws.cache_for(str(other)), "worktree", "list", "--porcelain")
    assert files(work) == files(other)


def test_forged_dotgit_is_not_adopted(ws: Workspaces, src: Path) -> None:
    """A work/.git rewritten to point at another slot's worktree is replaced, not followed."""
    ws.prepare(slot(ws, "s1"), str(src), "main", "job-1")
    ws.prepare(slot(ws, "s2"), str(src), "main", "job-2")
    s2_dotgit = (slot(ws, "s2") / "work" / ".git").read_text()
    (slot(ws, "s2") / "work" / "mine.txt").write_text("job-2's work\n")
    (slot(ws, "s1") / "work" / ".git").write_text(s2_dotgit)

    ws.prepare(slot(ws, "s1"), str(src), "main", "job-3")

    assert (slot(ws, "s1") / "work" / ".git").read_text() != s2_dotgit
    assert (slot(ws, "s2") / "work" / "mine.txt").read_text() == "job-2's work\n"
    assert files(slot(ws, "s1") / "work") == files(src)


def test_unremovable_leftovers_make_a_fresh_worktree(ws: Workspaces, src: Path) -> None:
    """A read-only directory left by a test run does not survive into the next job."""
    ws.prepare(slot(ws, "s1"), str(src), "main", "job-1")
    locked = slot(ws, "s1") / "work" / "locked"
    locked.mkdir()
    (locked / "inside.txt").write_text("x\n")
    locked.chmod(0o500)
    ws.prepare(slot(ws, "s1"), str(src), "main", "job-2")
    assert not locked.exists()
    assert files(slot(ws, "s1") / "work") == files(src)


def test_stale_index_lock_makes_a_fresh_worktree(ws: Workspaces, src: Path) -> None:
    """An index.lock left by a killed git in the worktree does not wedge the slot."""
    ws.prepare(slot(ws, "s1"), str(src), "main", "job-1")
    work = slot(ws, "s1") / "work"
    lock = Path(git(work, "rev-parse", "--path-format=absolute", "--git-path", "index.lock"))
    lock.write_text("")
    (work / "README.md").write_text("edited\n")
    prepared = ws.prepare(slot(ws, "s1"), str(src), "main", "job-2")
    assert prepared.start_tree == git(src, "rev-parse", "HEAD^{tree}")
    assert files(work) == files(src)
    assert not lock.exists()


def test_snapshot_of_an_unprepared_slot_is_refused(ws: Workspaces) -> None:
    """snapshot and diff name the slot that has no work tree."""
    with pytest.raises(WorkspaceError, match="not a slotrunner work tree"):
        ws.snapshot(slot(ws, "s9"), "job-1", "end")
    with pytest.raises(WorkspaceError, match="not a slotrunner work tree"):
        ws.diff(slot(ws, "s9"), "HEAD")


def _prepare_in_child(
    home: str, slot_dir: str, source: str, job_id: str, barrier: object, results: object
) -> None:
    try:
        barrier.wait(timeout=60)  # type: ignore[attr-defined]
        prepared = Workspaces(Path(home)).prepare(Path(slot_dir), source, "main", job_id)
        results.put((job_id, "ok", prepared.start_tree))  # type: ignore[attr-defined]
    except BaseException as exc:  # report, do not just die: the parent names the failure
        results.put((job_id, "error", repr(exc)))  # type: ignore[attr-defined]


def test_two_processes_prepare_from_one_cache_at_once(ws: Workspaces, src: Path) -> None:
    """Two worker processes preparing two slots from one (not yet cloned) cache both succeed."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_prepare_in_child,
            args=(str(ws.home), str(slot(ws, f"s{i}")), str(src), f"job-{i}", barrier, results),
        )
        for i in (1, 2)
    ]
    for proc in procs:
        proc.start()
    try:
        outcomes = sorted(results.get(timeout=90) for _ in procs)
    except queue.Empty:
        pytest.fail("a preparing process reported nothing")
    finally:
        for proc in procs:
            proc.join(timeout=30)
    tree = git(src, "rev-parse", "HEAD^{tree}")
    assert outcomes == [("job-1", "ok", tree), ("job-2", "ok", tree)]
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(list(ws.repos_dir.glob("*.git"))) == 1
    listing = git(ws.cache_for(str(src)), "worktree", "list", "--porcelain")
    for i in (1, 2):
        assert str(slot(ws, f"s{i}") / "work") in listing
        assert files(slot(ws, f"s{i}") / "work") == files(src)
