"""A real project for the environments tests and bench: ``six``, from the package index.

``six`` ships its own test suite (``test_six.py``, 200 tests in about a second under
pytest) and has no dependencies: a job can build a venv with pytest for it and run
the project's real tests (docs/architecture.md §Environments). Its sdist is
downloaded when a test needs it, never vendored, with the interpreter running the
suite (``python -m pip download``); the download is cached once per test session
under pytest's base temp dir. A download that fails raises :class:`RealProjectError`
with pip's own words: the test that needs the project fails, it is never skipped.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from filelock import FileLock

from runner.core.git import run_git
from tests.support.repos import make_repo

if TYPE_CHECKING:  # the benchmarks use this module too, without pytest running
    import pytest

SIX_VERSION = "1.17.0"
SIX = f"six=={SIX_VERSION}"
SDIST_NAME = f"six-{SIX_VERSION}.tar.gz"
_TOP = f"six-{SIX_VERSION}"
# pip's build metadata: not the project's source, and not what a checkout holds.
_DROPPED = ("six.egg-info",)
_DOWNLOAD_TIMEOUT_S = 300


class RealProjectError(RuntimeError):
    """The real project could not be fetched or unpacked; the message says why."""


def download_six(into: Path) -> Path:
    """``pip download`` the sdist of six into ``into``; the path of the tarball."""
    into.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    argv += ["--disable-pip-version-check", SIX, "-d", str(into)]
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=_DOWNLOAD_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RealProjectError(f"could not download {SIX} from the package index: {exc}") from None
    sdist = into / SDIST_NAME
    if proc.returncode != 0 or not sdist.is_file():
        tail = (proc.stderr or proc.stdout)[-2000:]
        raise RealProjectError(
            f"could not download the sdist of {SIX} from the package index "
            f"(`python {' '.join(argv[1:])}` exited {proc.returncode}):\n{tail}"
        )
    return sdist


def cached_six(factory: pytest.TempPathFactory) -> Path:
    """The sdist of six, downloaded once per test session (a lock for parallel runs)."""
    import pytest

    cache = factory.getbasetemp() / "six-sdist"
    with FileLock(str(cache) + ".lock"):
        sdist = cache / SDIST_NAME
        if sdist.is_file():
            return sdist
        try:
            return download_six(cache)
        except RealProjectError as exc:
            problem = str(exc)
    pytest.fail(problem, pytrace=False)  # outside the except: one message, no chain


def _checked(member: tarfile.TarInfo) -> str:
    """The member's path under the sdist's top directory; refuses anything odd."""
    path = PurePosixPath(member.name)
    if path.is_absolute() or ".." in path.parts or not path.parts or path.parts[0] != _TOP:
        raise RealProjectError(f"{SDIST_NAME}: member {member.name!r} is outside {_TOP}/")
    if not (member.isfile() or member.isdir()):
        raise RealProjectError(f"{SDIST_NAME}: member {member.name!r} is not a file or directory")
    return "/".join(path.parts[1:])


def source_files(sdist: Path) -> dict[str, str]:
    """The sdist's files (text) by path relative to the project's root, less pip's
    metadata. Members are read, never extracted, so no path in the archive can land
    outside a directory (and Python without ``tarfile.data_filter`` is as safe)."""
    files: dict[str, str] = {}
    try:
        with tarfile.open(sdist, "r:gz") as archive:
            for member in archive.getmembers():
                name = _checked(member)
                if not member.isfile() or name.split("/")[0] in _DROPPED:
                    continue
                handle = archive.extractfile(member)
                assert handle is not None  # a regular file
                files[name] = handle.read().decode("utf-8")
    except (OSError, tarfile.TarError, UnicodeDecodeError) as exc:
        raise RealProjectError(f"{sdist}: cannot read the sdist: {exc}") from None
    if "six.py" not in files or "test_six.py" not in files:
        raise RealProjectError(f"{sdist}: no six.py and test_six.py in it")
    return files


def six_repo(sdist: Path, repo: Path) -> str:
    """A git repository at ``repo`` holding six's source, one commit; its id."""
    return make_repo(repo, source_files(sdist))


def commit_change(repo: Path, name: str, content: str, message: str = "change") -> str:
    """Write ``name`` in ``repo`` and commit it on top of HEAD; the new commit's id."""
    (repo / name).parent.mkdir(parents=True, exist_ok=True)
    (repo / name).write_text(content)
    run_git("add", "--", name, cwd=repo, check=True)
    run_git("commit", "-q", "-m", message, cwd=repo, check=True)
    return run_git("rev-parse", "HEAD", cwd=repo, check=True).stdout.decode().strip()
