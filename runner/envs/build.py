"""Build a job's environment once per key, and hand every job of the key a hold on it.

docs/architecture.md §Environments. :func:`plan` turns a job's ``environment`` block
into a :class:`Plan`: the key (``runner.envs.key``), the sandbox mode the setup will
run under, and the path the environment is built at (its *mount*). :func:`ensure`
then, under the key's build lock (``runner.envs.store``):

- finds a good environment (``meta.json``) and takes a shared hold on it; or
- builds it: the key's directory emptied, the base commit's files checked out beside
  the environment (never a tree an agent touched), each setup command run there in a
  sandbox of its own that keeps the network (when ``network`` is true) and may write
  only the environment (bound at ``/slot/env``) and that throwaway checkout, every
  output appended to ``build.log``; ``meta.json`` written last, durably. A command
  that fails leaves ``failed.json`` and raises :class:`EnvSetupFailed` with the tail
  of its output; the next job of the key builds again.

A job that finds the lock taken waits for the build (a lock, not a race) and reports
the phase ``waiting for environment``; after a build, least-recently-used
environments past ``SLOTRUNNER_ENVS_MAX_GB`` are evicted.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import Timeout

from runner.core.git import run_git, stderr_of
from runner.core.settings import SandboxMode, Settings
from runner.envs.key import EnvKey, base_inputs, environment_key
from runner.envs.store import LOG_FILE, SOURCE_DIR, EnvError, EnvStore, Held, tree_bytes
from runner.workspace.fs import remove_tree
from tools.errors import ToolError
from tools.sandbox import run as sandbox
from tools.sandbox.environment import ENV_PATH
from tools.sandbox.policy import Bind, SlotLayout

TAIL_CHARS = 3000
_GIT_TIMEOUT_S = 600.0
_MiB = 1024 * 1024
# A setup installs packages: more room than a test run, the wall time the spec's.
SETUP_MEMORY_BYTES = 8192 * _MiB
SETUP_PROCESSES = 1024
SETUP_OPEN_FILES = 4096
SETUP_FILE_BYTES = 4096 * _MiB
SETUP_OUTPUT_BYTES = 4 * _MiB
_WAIT_POLL_S = 0.5


class EnvSetupFailed(EnvError):
    """A setup command failed; the message names it and ends with its output's tail."""


@dataclass(frozen=True)
class Plan:
    """What one job's ``environment`` block builds, on this host."""

    key: EnvKey
    setup: list[list[str]]
    network: bool
    timeout_s: float
    mode: SandboxMode  # the policy the setup runs under
    where: str  # "sandbox" (built at /slot/env) or "host" (in place, the sandbox off)
    warning: str | None
    repo: str
    base_commit: str
    mirror: Path

    @property
    def id(self) -> str:
        return self.key.key


@dataclass
class Ready:
    """A good environment held for one job; :meth:`close` when the job is done."""

    key: str
    mount: str
    built: bool
    build_s: float | None
    wait_s: float
    log: Path
    held: Held

    def close(self) -> None:
        self.held.close()

    def summary(self) -> dict[str, Any]:
        """The job result's ``environment``."""
        return {
            "key": self.key,
            "built": self.built,
            "build_s": self.build_s,
            "wait_s": round(self.wait_s, 3),
            "log": str(self.log),
        }


def plan(
    settings: Settings,
    spec: Any,
    *,
    repo: str,
    source_key: str,
    mirror: Path,
    base_commit: str,
) -> Plan:
    """The :class:`Plan` of ``spec`` (a job's ``EnvironmentSpec``) for this base."""
    try:
        used, warning = sandbox.sandbox_used(settings.sandbox)
    except ToolError as exc:
        raise EnvError(f"environment setup cannot run: {exc}") from None
    where = "sandbox" if used == "bwrap" else "host"
    setup = [list(argv) for argv in spec.setup]
    base = base_inputs(mirror, base_commit, spec.key_files)
    key = environment_key(source_key, base, setup, spec.network, where)
    return Plan(
        key=key,
        setup=setup,
        network=spec.network,
        timeout_s=float(spec.timeout_s),
        mode=settings.sandbox,
        where=where,
        warning=warning,
        repo=repo,
        base_commit=base_commit,
        mirror=mirror,
    )


def ensure(
    store: EnvStore,
    plan: Plan,
    *,
    job_id: str,
    phase: Callable[[str], None] = lambda _: None,
    should_stop: Callable[[], str | None] = lambda: None,
) -> Ready:
    """The plan's environment, built here if no good one exists; held until closed."""
    key = plan.id
    lock = store.build_lock(key)
    started = time.monotonic()
    try:
        lock.acquire(timeout=0)
    except Timeout:
        phase(f"waiting for environment {key} (another job is building it)")
        while True:
            stop = should_stop()
            if stop is not None:
                raise EnvError(f"stopped ({stop}) while waiting for environment {key}") from None
            try:
                lock.acquire(timeout=_WAIT_POLL_S)
                break
            except Timeout:
                continue
    try:
        wait_s = time.monotonic() - started
        meta = store.meta(key)
        built = meta is None
        if meta is None:
            meta = build(store, plan, job_id=job_id, phase=phase)
        held = store.hold(key)
    finally:
        lock.release()
    with contextlib.suppress(OSError, EnvError):
        store.evict(keep=frozenset({key}))
    build_s = meta.get("build_s")
    return Ready(
        key=key,
        mount=mount_of(store, plan),
        built=built,
        build_s=float(build_s) if isinstance(build_s, int | float) else None,
        wait_s=wait_s if not built else 0.0,
        log=store.log_path(key),
        held=held,
    )


def mount_of(store: EnvStore, plan: Plan) -> str:
    """Where the environment is seen, in its build and in every later command."""
    return ENV_PATH if plan.where == "sandbox" else str(store.env_dir(plan.id))


def setup_limits(timeout_s: float) -> sandbox.Limits:
    return sandbox.Limits(
        cpu_s=max(1, int(timeout_s)),
        wall_s=timeout_s,
        memory_bytes=SETUP_MEMORY_BYTES,
        processes=SETUP_PROCESSES,
        open_files=SETUP_OPEN_FILES,
        output_bytes=SETUP_OUTPUT_BYTES,
        file_bytes=SETUP_FILE_BYTES,
    )


def checkout(mirror: Path, commit: str, target: Path) -> None:
    """The base commit's files into ``target``, by git's own checkout (no hooks, no
    filters of the host: the pinned runner), with an index of its own."""
    target.mkdir(parents=True)
    env = {"GIT_INDEX_FILE": str(target.parent / "checkout.index")}
    base = ("--git-dir", str(mirror), "--work-tree", str(target))
    for args in (("read-tree", commit), ("checkout-index", "-a", "-f")):
        proc = run_git(*base, *args, env=env, timeout=_GIT_TIMEOUT_S)
        if proc.returncode != 0:
            raise EnvError(f"environment: git {args[0]} of {commit[:12]} failed: {stderr_of(proc)}")
    Path(env["GIT_INDEX_FILE"]).unlink(missing_ok=True)


def build(
    store: EnvStore, plan: Plan, *, job_id: str, phase: Callable[[str], None]
) -> dict[str, Any]:
    """Build the plan's environment (the caller holds its lock); its ``meta.json``."""
    key = plan.id
    env = store.reset(key)
    root = store.root(key)
    mount = mount_of(store, plan)
    source = root / SOURCE_DIR
    started = time.monotonic()
    with (root / LOG_FILE).open("a", encoding="utf-8") as log:
        log.write(
            f"# environment {key}: {plan.repo} at {plan.base_commit}, built by job {job_id}\n"
        )
        if plan.warning:
            log.write(f"# WARNING: {plan.warning}\n")
        try:
            checkout(plan.mirror, plan.base_commit, source)
            for number, argv in enumerate(plan.setup, 1):
                phase(f"building environment {key}: step {number}/{len(plan.setup)}")
                _step(store, plan, argv, number, source=source, env=env, mount=mount, log=log)
        finally:
            if source.exists():
                remove_tree(source)
        build_s = round(time.monotonic() - started, 3)
        log.write(f"# built in {build_s:.1f}s\n")
    meta = {
        "key": key,
        "repo": plan.repo,
        "base_commit": plan.base_commit,
        "setup": plan.setup,
        "network": plan.network,
        "where": plan.where,
        "mount": mount,
        "inputs": plan.key.material,
        "built_at": time.time(),
        "build_s": build_s,
        "built_by_job": job_id,
        "size_bytes": tree_bytes(root),
    }
    store.mark_ready(key, meta)
    return meta


def _step(
    store: EnvStore,
    plan: Plan,
    argv: list[str],
    number: int,
    *,
    source: Path,
    env: Path,
    mount: str,
    log: Any,
) -> None:
    args = [part.replace("$ENV", mount) for part in argv]
    log.write(f"$ {shlex.join(args)}\n")
    log.flush()
    layout = SlotLayout(work=source, binds=(Bind(env, mount, writable=True),), hide=(store.home,))
    try:
        result = sandbox.run(
            args,
            source,
            mode=plan.mode,
            limits=setup_limits(plan.timeout_s),
            hide=[store.home],
            merged=True,
            layout=layout if plan.where == "sandbox" else None,
            network=plan.network,
        )
        failed = result.exit_code != 0 or result.timed_out
        output = result.stdout
        how = (
            f"timed out after {plan.timeout_s:g}s"
            if result.timed_out
            else f"exited {result.exit_code}"
            if result.exit_code is not None
            else f"was killed by signal {result.killed_signal}"
        )
    except (OSError, ToolError) as exc:  # the program could not be started at all
        failed, output, how = True, f"{type(exc).__name__}: {exc}\n", "could not start"
    log.write(output)
    log.write(f"# step {number}: {how}\n")
    log.flush()
    if failed:
        tail = output[-TAIL_CHARS:]
        message = (
            f"environment setup failed: step {number}/{len(plan.setup)} "
            f"`{shlex.join(argv)}` {how}; output tail:\n{tail}"
        )
        record = {"key": plan.id, "repo": plan.repo, "error": message, "step": number}
        store.mark_failed(plan.id, record | {"at": time.time()})
        raise EnvSetupFailed(message)
