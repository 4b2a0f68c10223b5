"""A real project for the environments tests: ``six``, from the package index.

The download and the careful unpacking are the demo's (``ops/demo/six_source.py``,
what ``slotrunner demo --real`` and ``bench/envs.py`` use too); this adds the
once-per-session cache under pytest's base temp dir. A download that fails fails the
test that needs the project with pip's own words: it is never skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from filelock import FileLock

from ops.demo.sample_repo import commit_files, init_repo
from ops.demo.six_source import PROJECT, VERSION, RealDemoError, download, extract


def cached_six(factory: pytest.TempPathFactory) -> Path:
    """The sdist of six, downloaded once per test session (a lock for parallel runs)."""
    cache = factory.getbasetemp() / "six-sdist"
    with FileLock(str(cache) + ".lock"):
        sdist = cache / f"{PROJECT}-{VERSION}.tar.gz"
        if sdist.is_file():
            return sdist
        try:
            return download(cache)
        except RealDemoError as exc:
            problem = str(exc)
    pytest.fail(problem, pytrace=False)  # outside the except: one message, no chain


def six_repo(sdist: Path, repo: Path) -> str:
    """A git repository at ``repo`` holding six's source, one commit; its id."""
    extract(sdist, repo)
    return init_repo(repo, {}, f"{PROJECT} {VERSION}, as released (sdist)")


def commit_change(repo: Path, name: str, content: str, message: str = "change") -> str:
    """Write ``name`` in ``repo`` and commit it on top of HEAD; the new commit's id."""
    return commit_files(repo, {name: content}, message)
