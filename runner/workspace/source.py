"""A job's source repo (a path or a URL), checked and turned into its cache's ``<key>``.

``<key>`` is a readable name from the source plus 12 hex digits of the sha256 of the
normalised source (an absolute, resolved path or the URL), so two sources never share
a cache and two spellings of one local path do. URLs are limited to ``_URL_SCHEMES``:
git's ``ext::`` and friends would run commands on the worker.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from git import Git
from git.exc import UnsafeProtocolError

from runner.workspace.git import WorkspaceError

_SCP_LIKE = re.compile(r"[^/]+:")  # git's rule: a colon before the first slash is host:path
_URL_SCHEMES = frozenset({"file", "http", "https", "ssh", "git", "git+ssh", "ssh+git"})
_NOT_NAME_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Source:
    spec: str  # what git clone is given
    key: str


def parse_source(source: str) -> Source:
    text = source.strip() if isinstance(source, str) else ""
    if not text or text.startswith("-") or any(c in text for c in "\x00\n\r"):
        raise WorkspaceError(f"repo {source!r} is neither a path nor a URL")
    if "://" in text or _SCP_LIKE.match(text):
        scheme = urlsplit(text).scheme.lower() if "://" in text else "ssh"
        try:
            Git.check_unsafe_protocols(text)
        except UnsafeProtocolError:
            scheme = "ext"
        if scheme not in _URL_SCHEMES:
            raise WorkspaceError(
                f"repo URL {source!r}: scheme {scheme!r} not allowed "
                f"(use one of {', '.join(sorted(_URL_SCHEMES))})"
            )
        spec = text.rstrip("/")
        tail = [part for part in re.split(r"[/:]", spec) if part][-2:]
    else:
        path = Path(text).expanduser().resolve()
        if not path.exists():
            raise WorkspaceError(f"repo path {path} does not exist")
        if not (path / ".git").exists() and not (
            (path / "HEAD").is_file() and (path / "objects").is_dir()
        ):
            raise WorkspaceError(f"repo path {path} is not a git repository")
        spec = str(path)
        tail = [path.name]
    readable = "-".join(part.removesuffix(".git") for part in tail)
    readable = _NOT_NAME_SAFE.sub("-", readable).strip(".-")[:40] or "repo"
    return Source(spec, f"{readable}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}")
