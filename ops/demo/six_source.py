"""The real project ``slotrunner demo --real`` works on: six's source, from the package index.

six (one module, ``test_six.py`` with about 200 pytest tests that run in a second) is
small enough to fetch on every run and real enough that its tests need an installed
pytest: the jobs' shared environment (docs/architecture.md §Environments). Its sdist
comes from whatever index this machine's pip is configured for, with pip itself, so a
proxy or mirror set up for pip works here too.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import tarfile
from pathlib import Path, PurePosixPath

from ops.demo.sample_repo import init_repo
from ops.errors import OpsError

PROJECT = "six"
VERSION = "1.17.0"
REQUIREMENT = f"{PROJECT}=={VERSION}"
# Built by the sdist's own packaging; not source, and pytest would not need it.
_DROPPED = f"{PROJECT}.egg-info"


class RealDemoError(OpsError):
    """``slotrunner demo --real`` could not get its project: the download failed, or the
    archive is not what an sdist of it looks like."""


def download(dest: Path, timeout_s: float = 180.0) -> Path:
    """Download six's sdist into ``dest`` with pip; returns the archive's path."""
    dest.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    argv += ["--disable-pip-version-check", REQUIREMENT, "-d", str(dest)]
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise RealDemoError(
            f"could not download {REQUIREMENT}: pip did not finish within {timeout_s:g}s "
            "(is the package index reachable?)"
        ) from None
    if proc.returncode != 0:
        raise RealDemoError(
            f"could not download {REQUIREMENT} from the package index "
            f"(pip exited {proc.returncode}): {_last_error(proc.stderr or proc.stdout)}"
        )
    archives = sorted(dest.glob(f"{PROJECT}-{VERSION}.tar.gz"))
    if not archives:
        raise RealDemoError(f"pip reported success but left no {PROJECT} sdist in {dest}")
    return archives[0]


def _last_error(output: str) -> str:
    """pip's own explanation: its last ERROR line, else its last line, on one line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    chosen = (errors or lines or ["no output"])[-1]
    return chosen[:300]


def extract(archive: Path, dest: Path) -> None:
    """Unpack the sdist's files into ``dest``, without its top directory and egg-info.

    Only regular files and directories under the top directory are taken: a link, a
    device, an absolute path or a ``..`` is refused. Python's own ``data`` filter is
    used as well where this Python has it (3.11.4 and later; early 3.11 patch
    releases lack ``filter=``).
    """
    top = f"{PROJECT}-{VERSION}"
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = []
            for member in tar.getmembers():
                parts = PurePosixPath(member.name).parts
                if member.name.startswith("/") or ".." in parts or not parts or parts[0] != top:
                    raise RealDemoError(f"{archive.name}: unexpected path {member.name!r}")
                if not (member.isfile() or member.isdir()):
                    raise RealDemoError(f"{archive.name}: {member.name!r} is not a plain file")
                if len(parts) == 1 or parts[1] == _DROPPED:
                    continue
                inner = copy.copy(member)
                inner.name = str(PurePosixPath(*parts[1:]))
                inner.mode = member.mode & 0o755
                members.append(inner)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, members=members, filter="data")
            else:
                tar.extractall(dest, members=members)  # members checked above
    except (OSError, tarfile.TarError) as exc:
        raise RealDemoError(f"could not unpack {archive.name}: {exc}") from None
    for needed in (f"{PROJECT}.py", f"test_{PROJECT}.py"):
        if not (dest / needed).is_file():
            raise RealDemoError(f"{archive.name} has no {needed}")


def fetch(work: Path) -> tuple[Path, str]:
    """six's source committed into a git repository under ``work``: (repo, base commit)."""
    archive = download(work / "download")
    repo = work / f"{PROJECT}-{VERSION}"
    extract(archive, repo)
    return repo, init_repo(repo, {}, f"{PROJECT} {VERSION}, as released (sdist)")
