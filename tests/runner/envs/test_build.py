"""Building an environment in its own sandbox, once per key (runner/envs/build.py).

Every build here runs its setup under the real bwrap. The network is asked of a
listener of the test's own on loopback: a setup that may reach the network reaches
it, and it is the test's gate (the setup blocks until the test answers), so the race
of two builders is made for real in two processes.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.core.settings import Settings
from runner.envs.build import EnvSetupFailed, ensure
from runner.envs.store import EnvStore
from tests.support.envs import plan_for
from tests.support.repos import REPO, make_repo
from tools.sandbox import run as sandbox
from tools.sandbox.environment import environment_of
from tools.sandbox.policy import SlotLayout

# A setup step that connects to the test's listener and exits with the byte it is sent.
ASK = (
    "import socket,sys; s=socket.create_connection(('127.0.0.1',{port}),5); sys.exit(s.recv(1)[0])"
)

BUILDER = """
import json, sys
from pathlib import Path
from runner.core.settings import Settings
from runner.envs.build import ensure
from runner.envs.store import EnvStore
from tests.support.envs import plan_for
args = json.loads(sys.argv[1])
settings = Settings.from_env(args["env"])
plan = plan_for(settings, Path(args["repo"]), args["base"], args["setup"], network=True)
say = lambda text: print(text, flush=True)
ready = ensure(EnvStore(settings.home), plan, job_id=args["job"], phase=say)
print(json.dumps(ready.summary()), flush=True)
"""


@pytest.fixture
def sandboxed(settings: Settings) -> Settings:
    return settings.with_(sandbox="required")


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "repo"
    return path, make_repo(path, {"app.py": "VALUE = 'base'\n", "README": "r\n"})


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)
        sock.settimeout(60)
        yield sock


def test_setup_runs_once_from_the_base_files_and_later_jobs_reuse_it(
    sandboxed: Settings, repo: tuple[Path, str]
) -> None:
    path, base = repo
    (path / "app.py").write_text("VALUE = 'an uncommitted edit'\n")  # never what setup sees
    setup = [["bash", "-c", "cp app.py $ENV/; echo built >> $ENV/count"]]
    store = EnvStore(sandboxed.home)
    plan = plan_for(sandboxed, path, base, setup)
    first = ensure(store, plan, job_id="job-1")
    first.close()
    second = ensure(store, plan, job_id="job-2")
    second.close()
    env = store.env_dir(plan.id)
    assert (env / "count").read_text() == "built\n"
    assert (env / "app.py").read_text() == "VALUE = 'base'\n"
    assert first.built and not second.built
    assert first.summary()["build_s"] == second.summary()["build_s"] is not None
    assert first.mount == "/slot/env"
    log = store.log_path(plan.id).read_text()
    assert log.count("built by job") == 1 and "$ bash -c 'cp app.py /slot/env/;" in log
    assert not (store.root(plan.id) / "src").exists()  # the throwaway checkout is gone


def test_the_setup_sandbox_writes_only_the_environment(
    sandboxed: Settings, repo: tuple[Path, str], tmp_path: Path
) -> None:
    path, base = repo
    home = sandboxed.home.resolve()
    (sandboxed.slots_dir / "slot-0" / "work").mkdir(parents=True)
    targets = [home / "escaped", sandboxed.slots_dir / "slot-0" / "work" / "escaped"]
    targets += [path / "escaped", tmp_path / "escaped"]
    script = "; ".join(f"echo x > {t} 2>/dev/null" for t in targets)
    setup = [["bash", "-c", f"{script}; echo junk > junk.txt; echo ok > $ENV/ok"]]
    store = EnvStore(sandboxed.home)
    plan = plan_for(sandboxed, path, base, setup, network=False)
    ensure(store, plan, job_id="job-1").close()
    assert (store.env_dir(plan.id) / "ok").read_text() == "ok\n"
    assert [t for t in targets if t.exists()] == []
    assert not list(store.root(plan.id).rglob("junk.txt"))


def test_a_failed_setup_is_not_kept_and_the_next_job_builds_again(
    sandboxed: Settings, repo: tuple[Path, str], listener: socket.socket
) -> None:
    """The first build's step is told to fail, the second's to succeed: the second job
    built (the failure was not cached as good, nor as failed)."""
    path, base = repo
    port = listener.getsockname()[1]
    setup = [["python3", "-c", "print('resolving'); " + ASK.format(port=port)]]
    store = EnvStore(sandboxed.home)
    plan = plan_for(sandboxed, path, base, setup, network=True)
    answers = iter([b"\x07", b"\x00"])

    def answer_both() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            with conn:
                conn.sendall(next(answers))

    server = threading.Thread(target=answer_both, daemon=True)
    server.start()
    with pytest.raises(EnvSetupFailed, match=r"step 1/1 `python3 -c .*` exited 7; output tail:\n"):
        ensure(store, plan, job_id="job-1")
    assert store.meta(plan.id) is None
    failure = store.failure(plan.id)
    assert failure is not None and "resolving" in failure["error"]
    again = ensure(store, plan, job_id="job-2")
    again.close()
    server.join(30)
    assert again.built and store.meta(plan.id) is not None and store.failure(plan.id) is None


def test_without_network_the_setup_cannot_connect(
    sandboxed: Settings, repo: tuple[Path, str], listener: socket.socket
) -> None:
    path, base = repo
    setup = [["python3", "-c", ASK.format(port=listener.getsockname()[1])]]
    plan = plan_for(sandboxed, path, base, setup, network=False)
    refused = r"(?s)exited 1; output tail:.*(ConnectionRefusedError|Network is unreachable)"
    with pytest.raises(EnvSetupFailed, match=refused):
        ensure(EnvStore(sandboxed.home), plan, job_id="job-1")


def test_two_jobs_starting_together_build_once(
    sandboxed: Settings, repo: tuple[Path, str], listener: socket.socket
) -> None:
    """Two builder processes on one key: the second waits on the first's lock while the
    first's setup is held open by the test, then takes the environment it built."""
    path, base = repo
    setup = [["python3", "-c", ASK.format(port=listener.getsockname()[1])]]
    args = {"env": sandboxed.to_env(), "repo": str(path), "base": base, "setup": setup}

    def builder(job: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", BUILDER, json.dumps(args | {"job": job})],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )

    first = builder("job-1")
    conn, _ = listener.accept()  # the first build's setup is running, and waits on us
    assert first.stdout is not None and "building environment" in first.stdout.readline()
    second = builder("job-2")
    assert second.stdout is not None
    assert "waiting for environment" in second.stdout.readline()
    with conn:
        conn.sendall(b"\x00")
    outputs = [json.loads(p.communicate(timeout=60)[0].splitlines()[-1]) for p in (first, second)]
    assert [o["built"] for o in outputs] == [True, False]
    listener.settimeout(0.2)
    with pytest.raises(TimeoutError):
        listener.accept()  # the setup ran once: nobody else ever connected


def test_an_editable_install_shows_each_slot_its_own_tree(
    sandboxed: Settings, tmp_path: Path
) -> None:
    """``pip install -e .`` in the setup points at ``/slot/work``, which is each slot's
    own tree in every later command: one slot's edit never reaches another."""
    path = tmp_path / "repo"
    files = {
        "pyproject.toml": '[project]\nname = "pkg"\nversion = "1"\n'
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n',
        "pkg/__init__.py": "VALUE = 'base'\n",
    }
    base = make_repo(path, files)
    # The build backend comes from the package index, as in a real project's setup.
    setup = [["python3", "-m", "venv", "$ENV"], ["$ENV/bin/pip", "install", "-q", "-e", "."]]
    store = EnvStore(sandboxed.home)
    held = ensure(store, plan_for(sandboxed, path, base, setup, network=True), job_id="job-1")
    env = environment_of(sandboxed.home, {"environment": {"key": held.key, "mount": held.mount}})
    assert env is not None
    seen = {}
    for name in ("A", "B"):
        work = tmp_path / f"slot-{name}"
        (work / "pkg").mkdir(parents=True)
        (work / "pkg" / "__init__.py").write_text(f"VALUE = {name!r}\n")
        result = sandbox.run(
            ["python", "-c", "import pkg, sys; print(pkg.VALUE, sys.prefix)"],
            work,
            mode="required",
            env=env.variables,
            layout=SlotLayout(work=work, binds=(env.bind,), hide=(sandboxed.home,)),
        )
        assert result.exit_code == 0, result.stderr
        seen[name] = result.stdout.split()
    held.close()
    assert seen == {"A": ["A", "/slot/env"], "B": ["B", "/slot/env"]}
