"""What the benchmarks stand on: a run context, settings, repositories, child servers.

Everything is real and started the way an operator starts it: the tool server through
``ops.testing.stack.start_toolserver`` (``slotrunner toolserver`` in a child process),
Celery workers through ``ops.testing.stack.start_worker``, an embedded Redis under the
run's scratch directory (never the Redis on port 6379).
"""

from __future__ import annotations

import base64
import os
import random
import sys
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import redis

from bench.stats import BenchError
from ops.testing.stack import Child, free_port, stack_env, start_toolserver, wait_http
from runner.core.git import run_git, stderr_of
from runner.core.logs import EventLog
from runner.core.settings import Settings
from runner.core.stamp import Stamp
from runner.slots.pool import SlotPool
from runner.workspace.workspaces import Workspaces

REPO_ROOT = Path(__file__).resolve().parents[1]
LEASE_TTL_S = 86_400  # longer than any run: an expiring lease would refuse calls mid-benchmark


@dataclass
class Context:
    """One run of the suite: its mode, scratch space, Redis, and shared observations."""

    quick: bool
    scratch: Path
    redis_url: str  # db 0; other databases of the same server via redis_db()
    log: Callable[[str], None]
    # Peak memory seen during the runs: name -> (MB, what it was measured on).
    memory: dict[str, tuple[float, str]] = field(default_factory=dict)

    def dir(self, name: str) -> Path:
        path = self.scratch / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def redis_db(self, db: int) -> str:
        return self.redis_url.rsplit("/", 1)[0] + f"/{db}"

    def pick(self, quick: int, full: int) -> int:
        return quick if self.quick else full


def settings_for(
    home: Path, redis_url: str, *, slots: int = 1, sandbox: str = "auto", name: str = "bench"
) -> Settings:
    """Settings for one benchmark: its own home and host id, so keys never collide."""
    home.mkdir(parents=True, exist_ok=True)
    return Settings.from_env(
        {
            "SLOTRUNNER_HOME": str(home),
            "REDIS_URL": redis_url,
            "SLOTRUNNER_SLOTS": str(slots),
            "SLOTRUNNER_HOST_ID": f"{name}-{uuid.uuid4().hex[:8]}",
            "SLOTRUNNER_LEASE_TTL_S": str(LEASE_TTL_S),
            "SLOTRUNNER_SANDBOX": sandbox,
        }
    )


def child_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of a child process serving ``settings`` (as in tests/conftest.py)."""
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    return stack_env(os.environ, PYTHONPATH=pythonpath, **settings.to_env(), **extra)


def toolserver(
    settings: Settings,
    log_dir: Path,
    *,
    fence: bool = True,
    noop_effect: bool = False,
    **extra_env: str,
) -> tuple[Settings, Child]:
    """A real tool server for ``settings`` on a free port; the settings point at it.

    ``fence=False`` starts the test server with the envelope check off
    (``ops.testing.toolserver``): the baseline the fence's cost is measured against;
    ``noop_effect=True`` the one whose ``write_file`` writes nothing (a floor).
    """
    port = free_port()
    settings = settings.with_(toolserver_url=f"http://127.0.0.1:{port}")
    env = child_env(settings, **extra_env)
    child = start_toolserver(env, port, log_dir, fence=fence, noop_effect=noop_effect)
    return settings, child


def noop_server(log_dir: Path, module: str = "bench.noop_server", *args: str) -> tuple[str, Child]:
    """The baseline HTTP server (``bench.noop_server``), started the same way; or another
    no-op server module with the same ``--port`` and ``/healthz`` (``bench.noop_mcp``,
    ``bench.noop_proxy``), ``args`` after its port."""
    port = free_port()
    env = stack_env(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
    )
    name = module.rpartition(".")[2].replace("_", "-")
    child = Child(
        name,
        [sys.executable, "-m", module, "--port", str(port), *args],
        env,
        log_dir / f"{name}.out",
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(child, f"{url}/healthz", 30.0)
    return url, child


def lease_slot(settings: Settings, repo: Path, base: str, job_id: str) -> tuple[Stamp, Path]:
    """Lease a slot and prepare its tree at ``base``, as tests/tools/server/test_faults.py does."""
    client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    try:
        stamp = SlotPool(settings, client, EventLog(settings)).lease(job_id, 1, wait_s=5.0)
    finally:
        client.close()
    slot_dir = settings.slots_dir / stamp.slot_id
    Workspaces(settings.home).prepare(slot_dir, str(repo), base, job_id)
    return stamp, slot_dir


# -- repositories ------------------------------------------------------------------


def git(cwd: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    proc = run_git(*args, cwd=cwd, env=env)
    if proc.returncode != 0:
        raise BenchError(f"git {' '.join(args)} failed in {cwd}: {stderr_of(proc)}")
    return proc.stdout.decode().strip()


def git_reset(tree: Path, commit: str) -> None:
    """The bare way to put a tree back at ``commit``: the baseline of a slot recycle."""
    git(tree, "checkout", "-q", "--force", "--detach", commit)
    git(tree, "reset", "--quiet", "--hard", commit)
    git(tree, "clean", "-ffdxq")


def make_repo(path: Path, files: Mapping[str, str]) -> str:
    """A git repository with one commit of ``files``; returns the commit id."""
    path.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "base")
    return git(path, "rev-parse", "HEAD")


def _text(rng: random.Random, size: int) -> str:
    """``size`` bytes of source-like text: 76-column lines of base64."""
    raw = base64.b64encode(rng.randbytes(size * 3 // 4 + 3)).decode()[:size]
    return "\n".join(raw[i : i + 75] for i in range(0, len(raw), 76)) + "\n"


@dataclass(frozen=True)
class BigRepo:
    path: Path
    base_a: str
    base_b: str  # base_a with a tenth of the files changed, some added and some removed
    files: int
    size_bytes: int


def generate_repo(path: Path, files: int, total_bytes: int, seed: int = 1) -> BigRepo:
    """A repository of ``files`` files (``total_bytes`` in all) over two commits."""
    rng = random.Random(seed)
    per_file = max(64, total_bytes // files)
    names = [f"src/pkg{i % 40:02d}/mod_{i:05d}.py" for i in range(files)]
    base_a = make_repo(path, {name: _text(rng, per_file) for name in names})
    changed = rng.sample(names, files // 10)
    for name in changed:
        (path / name).write_text(_text(rng, per_file))
    for name in rng.sample(sorted(set(names) - set(changed)), files // 100 or 1):
        (path / name).unlink()
    for i in range(files // 100 or 1):
        added = path / f"src/added/new_{i:04d}.py"
        added.parent.mkdir(parents=True, exist_ok=True)
        added.write_text(_text(rng, per_file))
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "next")
    base_b = git(path, "rev-parse", "HEAD")
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and ".git" not in p.parts)
    return BigRepo(path, base_a, base_b, files, size)
