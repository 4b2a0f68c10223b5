"""A work tree deeper than Python walks (an agent's write_file of a path of 1500
components makes one) is still cleaned: the slot's recycle starts with these two, and a
RecursionError there failed every later job leased on that slot."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.workspace.fs import remove_nested_git, remove_tree

DEPTH = 1500  # past Python's recursion limit; the path stays under the tools' 4096 chars


def _deep(top: Path, depth: int = DEPTH) -> None:
    """``top/a/a/.../a`` (by file descriptor: the path is past what a name may be)
    holding a planted ``.git`` file and a directory without write permission."""
    fd = os.open(top, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("a", dir_fd=fd)
            inner = os.open("a", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        os.close(os.open(".git", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
        os.mkdir("locked", 0o500, dir_fd=fd)
    finally:
        os.close(fd)


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    # pytest's own cleanup of old temp dirs recurses: never leave a deep tree behind.
    try:
        yield tmp_path
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(tmp_path)], check=False)
        subprocess.run(["rm", "-rf", "--", *map(str, tmp_path.iterdir())], check=False)


def _depth_of_a(top: Path) -> int:
    found = subprocess.run(
        ["find", str(top), "-name", ".git", "-path", "*/a/*"], capture_output=True, text=True
    )
    return len(found.stdout.split())


def test_deep_trees_are_removed_and_their_nested_git_found(scratch: Path) -> None:
    """remove_nested_git finds the .git 1500 levels down; remove_tree removes it all."""
    work = scratch / "work"
    work.mkdir()
    (work / ".git").write_text("gitdir: elsewhere\n")  # the root's own: kept
    _deep(work)
    assert _depth_of_a(work) == 1
    remove_nested_git(work)
    assert _depth_of_a(work) == 0 and (work / ".git").is_file()
    remove_tree(work)
    assert not work.exists()
