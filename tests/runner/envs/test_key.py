"""What makes two jobs share an environment, and what keeps them apart (runner/envs/key.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.core.settings import Settings
from runner.envs.store import EnvError
from tests.support.envs import commit_file, plan_for
from tests.support.repos import make_repo

SETUP = [["bash", "-c", "true"]]


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "repo"
    return path, make_repo(path, {"requirements.txt": "pytest\n", "app.py": "x = 1\n"})


def test_the_same_inputs_give_the_same_key_and_each_input_changes_it(
    settings: Settings, repo: tuple[Path, str]
) -> None:
    path, base = repo
    key = plan_for(settings, path, base, SETUP).id
    assert plan_for(settings, path, base, SETUP).id == key
    assert len(key) == 24 and int(key, 16) >= 0
    assert plan_for(settings, path, base, [["bash", "-c", "false"]]).id != key
    assert plan_for(settings, path, base, SETUP, network=False).id != key
    assert plan_for(settings.with_(sandbox="off"), path, base, SETUP).id != key
    newer = commit_file(path, "app.py", "x = 2\n")
    assert plan_for(settings, path, newer, SETUP).id != key


def test_with_key_files_only_their_contents_count(
    settings: Settings, repo: tuple[Path, str]
) -> None:
    """A new commit that leaves the listed files alone reuses the environment; one that
    changes them does not."""
    path, base = repo
    files = {"key_files": ["requirements.txt"]}
    key = plan_for(settings, path, base, SETUP, **files).id
    other = commit_file(path, "app.py", "x = 2\n")
    assert plan_for(settings, path, other, SETUP, **files).id == key
    changed = commit_file(path, "requirements.txt", "pytest\nhypothesis\n")
    assert plan_for(settings, path, changed, SETUP, **files).id != key


def test_a_key_file_missing_from_the_base_is_named(
    settings: Settings, repo: tuple[Path, str]
) -> None:
    path, base = repo
    with pytest.raises(EnvError, match=r"key_files: 'poetry.lock' is not there"):
        plan_for(settings, path, base, SETUP, key_files=["poetry.lock"])
    (path / "sub").mkdir()
    sub = commit_file(path, "sub/x", "1\n")
    with pytest.raises(EnvError, match=r"key_files: 'sub' is a tree"):
        plan_for(settings, path, sub, SETUP, key_files=["sub"])
