"""The one pinned git (runner/core/git.py): no hook runs, host config changes no tree id."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ops.testing.chaos.expect import expected_tree
from runner.core.git import GitError, add_all, git_text, run_git
from runner.core.settings import Settings
from runner.workspace.git import GitRunner, WorkspaceError

FILES = {"a.txt": "one\r\ntwo\r\n", "build.log": "noise\n", "pkg/b.py": "x = 1\n"}


def plain_git(cwd: Path, *args: str) -> str:
    """The host's own git, unpinned: how a test fixture makes a repository."""
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def make_repo(path: Path) -> str:
    path.mkdir()
    plain_git(path, "init", "-q", "-b", "main")
    for name, content in FILES.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(content.encode())
    plain_git(path, "-c", "core.autocrlf=false", "add", "-A")
    plain_git(path, "commit", "-q", "-m", "base")
    return plain_git(path, "rev-parse", "HEAD")


def hostile_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A global git config that would change trees and run hooks, were it obeyed."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    ran = tmp_path / "hook-ran"
    for name in ("pre-commit", "post-commit", "post-checkout"):
        hook = hooks / name
        hook.write_text(f"#!/bin/sh\ntouch {ran}\n")
        hook.chmod(0o755)
    excludes = tmp_path / "excludes"
    excludes.write_text("*.log\n")
    config = tmp_path / "gitconfig"
    config.write_text(
        f"[core]\n\tautocrlf = true\n\texcludesFile = {excludes}\n\thooksPath = {hooks}\n"
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    return ran


def test_host_config_and_hooks_are_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    base = make_repo(repo)
    clean_tree = git_text("rev-parse", f"{base}^{{tree}}", cwd=repo)
    ran = hostile_host(tmp_path, monkeypatch)
    (repo / "c.txt").write_text("three\n")
    run_git("add", "--all", cwd=repo, check=True)
    run_git("commit", "-q", "-m", "more", cwd=repo, check=True)
    run_git("checkout", "-q", "--detach", base, cwd=repo, check=True)
    assert not ran.exists()
    index = {"GIT_INDEX_FILE": str(tmp_path / "index")}
    (repo / "c.txt").unlink(missing_ok=True)
    run_git("add", "--all", cwd=repo, env=index, check=True)
    # CRLF kept and build.log not excluded: the tree is the committed one.
    assert git_text("write-tree", cwd=repo, env=index) == clean_tree


def test_chaos_expectation_and_workspace_use_the_same_git(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chaos checker's expected tree is the committed one even on a hostile host."""
    repo = tmp_path / "repo"
    base = make_repo(repo)
    clean_tree = git_text("rev-parse", f"{base}^{{tree}}", cwd=repo)
    hostile_host(tmp_path, monkeypatch)
    settings = Settings.from_env({"SLOTRUNNER_HOME": str(tmp_path / "home")})
    assert expected_tree(repo, base, [], settings) == clean_tree


def test_failures_name_the_command(tmp_path: Path) -> None:
    with pytest.raises(GitError, match=r"git rev-parse nosuch failed \(exit 128\)"):
        run_git("rev-parse", "nosuch", cwd=tmp_path, check=True)
    with pytest.raises(WorkspaceError, match=r"git rev-parse failed \(exit 128\)"):
        GitRunner()("-C", str(tmp_path), "rev-parse", "nosuch")
    status, out, err = GitRunner()("-C", str(tmp_path), "rev-parse", "nosuch", check=False)
    assert status == 128 and out == b"" and "not a git repository" in err


def test_add_all_never_runs_git_inside_a_nested_repo_and_records_the_same_tree(
    tmp_path: Path,
) -> None:
    """A gitlink whose nested repo has a filter driver of its own and a dirty file: plain
    ``git add --all`` runs ``git status`` in there (the driver runs) when its HEAD did not
    move; add_all never does, and both record the same tree, a moved HEAD included."""
    repo = tmp_path / "repo"
    make_repo(repo)
    marker = tmp_path / "driver-ran"
    sub = repo / "sub"
    sub.mkdir()
    plain_git(sub, "init", "-q")
    plain_git(sub, "config", "filter.evil.clean", f"touch {marker}; cat")
    (sub / ".gitattributes").write_text("* filter=evil\n")
    (sub / "x").write_text("x\n")
    plain_git(sub, "add", "-A")
    plain_git(sub, "commit", "-q", "-m", "nested")
    plain_git(repo, "add", "sub")
    plain_git(repo, "commit", "-q", "-m", "gitlink")
    marker.unlink(missing_ok=True)
    trees = []
    for moved in (False, True):
        if moved:
            plain_git(sub, "commit", "-q", "--allow-empty", "-m", "moved")
        (sub / "x").write_text("y\n")  # dirty, same size: a status in there re-hashes it
        marker.unlink(missing_ok=True)  # the nested repo's own commit ran its own driver
        for stage in ("pinned", "plain"):
            env = {"GIT_INDEX_FILE": str(tmp_path / f"index-{stage}-{moved}")}
            subprocess.run(["cp", str(repo / ".git" / "index"), env["GIT_INDEX_FILE"]], check=True)
            if stage == "pinned":
                assert add_all(repo, "-C", str(repo), env=env).returncode == 0
                assert not marker.exists()
            else:
                subprocess.run(
                    ["git", "add", "--all"], cwd=repo, env={**env, "PATH": "/usr/bin:/bin"}
                )
                # The trap is armed: a plain add looks inside when the HEAD did not move.
                assert marker.exists() is not moved
                marker.unlink(missing_ok=True)
            trees.append(git_text("write-tree", cwd=repo, env=env))
        assert trees[-1] == trees[-2]
    assert trees[0] != trees[2]  # the moved HEAD is recorded
