"""Every `slotrunner` verb driven with generated argument vectors (issue #15).

Whatever the vector: an exit code of docs/architecture.md §Errors (0, 1, 2, 3; 70, an
internal error, never), at most one `error:` line and at most one click `Error:` line,
never a traceback. In process (click's runner), against the session's embedded Redis
(database 15, where no worker of the suite listens); the verbs that would serve or run
a campaign are kept from starting: a Redis at a closed port (gateway, worker), a port
already taken (toolserver, fake-endpoint), and an argument that is always refused
appended last (chaos, demo)."""

from __future__ import annotations

import json
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType

import click
import pytest
import redis
from click.testing import CliRunner, Result
from hypothesis import given
from hypothesis import strategies as st

from ops.testing.synthlog import clean_log
from runner.cli.main import main
from runner.core import keys
from runner.core.settings import Settings
from runner.jobs.models import JobResult
from tests.support.detectlog import result_line
from tests.support.fuzz import HOSTILE, STRINGS, fuzz_settings, stderr_lines
from tests.support.ports import refusing_port

DOCUMENTED = {0, 1, 2, 3}
# Flags after which a verb runs until stopped: never generated.
FOREVER: dict[tuple[str, ...], set[str]] = {
    ("slots", "list"): {"--watch"},
    ("ops", "detect"): {"--follow"},
}
# Appended to every vector of a verb that would start a whole stack if its arguments
# held: always refused, so the verb never gets past its arguments.
REFUSED_LAST: dict[tuple[str, ...], list[str]] = {
    ("chaos",): ["--faults", "no_such_fault"],
    ("demo",): ["--jobs", "0"],
}
# Needs Redis only to run, and would serve if it could reach it.
CLOSED_REDIS = {("gateway",), ("worker",)}
EXTRA = st.sampled_from(["--bogus", "-z", "--", "--help", "-h", "--json", "x", ""])
INTS = st.sampled_from(["0", "-1", "1", "2", "65536", "x", "", "1.5", "9" * 30, "0x10"])
# No large finite number: a wait or a timeout must end within the test.
FLOATS = st.sampled_from(["0", "-1", "0.01", "nan", "inf", "-inf", "1e309", "x", "", "1e-9"])


@dataclass
class Corpus:
    """The files, ports and ids the generated arguments name."""

    root: Path
    busy_port: int
    closed_port: int
    webhook: str  # answers every page 200 at once

    def path(self, name: str) -> str:
        return str(self.root / name)

    @property
    def files(self) -> list[str]:
        names = ["missing.json", "bad.json", "invalid.json", "valid.json", "deep.json", "dir"]
        return [*map(self.path, names), "-", "/dev/null/x", ""]

    @property
    def logs(self) -> list[str]:
        names = ["clean.jsonl", "incident.jsonl", "garbage.bin", "missing.jsonl", "*.jsonl"]
        return [*map(self.path, names), "-"]

    def specific(self, verb: tuple[str, ...], option: str) -> list[str] | None:
        """Values of an option that the generic corpus would not reach, or must not."""
        ports = [str(self.busy_port), "-1", "65536", "x", ""]
        hosts = ["127.0.0.1", "256.0.0.1", "bad host"]
        if verb == ("toolserver",):
            # Off loopback without a token it refuses; on loopback the port is taken.
            hosts, ports = [*hosts, "0.0.0.0", "", "localhost"], [*ports, "0"]
        closed = f"http://127.0.0.1:{self.closed_port}"
        table = {
            "--port": ports,
            "--host": hosts,
            "--job": ["job-a", "a\nb", "-x", "a" * 200, "../etc", "\udcff"],
            "--slot": ["S0", "S1", "S99", "../x", "", "S0\n"],
            "--tool": ["read_file", "nope", "", "exec\n", "\udcff"],
            "--repo": [self.path("missing-repo"), "-x", "ext::sh -c x", ""],
            "--url": [closed, "http://[::1", "ftp://x", "http://", "x"],
            "--webhook": [self.webhook, "ftp://x", "http://[::1", "x"],
            "--faults": ["no_such_fault", "", ",", "http_429,,x"],
            "--script": [*self.files, self.path("script.json"), self.path("empty.json")],
            "--concurrency": ["1,2", "0", "a", "", "-1", "1,,2"],
            "--state-dir": [self.path("state"), "/dev/null/x", self.path("valid.json")],
            "--to": [self.path("restored"), "/dev/null/x", self.path("dir")],
            "--report-dir": [self.path("report"), "/dev/null/x"],
            "--json-out": [self.path("out.json"), "/dev/null/x"],
            "--plot": [self.path("out.png"), "/dev/null/x"],
            "--api-key-env": ["HOME", "NO_SUCH_VAR_X", "a\x00b", ""],
            "--loglevel": ["INFO", "bogus", ""],
            "--hostname": ["w@h", "", "a\nb"],
        }
        return table.get(option)

    def argument(self, verb: tuple[str, ...]) -> list[str]:
        if verb in (("submit",), ("envs", "build")):
            return self.files
        if verb in (("ops", "detect"), ("ops", "verify")):
            return self.logs
        return ["job-a", "done-1", "failed-1", "queued-1", "a\x00", "a" * 300, "../x", "\udcff"]


def _commands() -> dict[tuple[str, ...], click.Command]:
    found: dict[tuple[str, ...], click.Command] = {}
    ctx = click.Context(main)

    def walk(group: click.Group, path: tuple[str, ...]) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None
            if isinstance(command, click.Group):
                walk(command, (*path, name))
            else:
                found[(*path, name)] = command

    walk(main, ())
    return found


COMMANDS = _commands()


def _values(
    corpus: Corpus, verb: tuple[str, ...], param: click.Parameter
) -> st.SearchStrategy[str]:
    if isinstance(param, click.Argument):
        return st.sampled_from(corpus.argument(verb)) | HOSTILE
    option = param.opts[-1]
    special = corpus.specific(verb, option)
    if special is not None:
        return st.sampled_from(special)
    kind = param.type
    if isinstance(kind, click.Choice):
        return st.sampled_from([*map(str, kind.choices), "bogus", ""])
    if isinstance(kind, click.types.IntParamType):
        return INTS
    if isinstance(kind, click.types.FloatParamType):
        return FLOATS
    if isinstance(kind, click.Path):
        return st.sampled_from(corpus.files)
    return STRINGS


@st.composite
def vectors(draw: st.DrawFn, corpus: Corpus) -> list[str]:
    verb = draw(st.sampled_from(sorted(COMMANDS)))
    params = [p for p in COMMANDS[verb].params if p.opts[-1] not in FOREVER.get(verb, ())]
    options = [p for p in params if isinstance(p, click.Option)]
    arguments = [p for p in params if isinstance(p, click.Argument)]
    tokens: list[str] = []
    positional = draw(st.booleans())
    if arguments and positional:
        tokens += [draw(_values(corpus, verb, argument)) for argument in arguments]
    for option in (o for o in options if o.required):  # mostly given, so the verb runs
        if draw(st.integers(0, 3)):
            tokens += [option.opts[-1], draw(_values(corpus, verb, option))]
    for _ in range(draw(st.integers(0, 5))):
        pick = draw(st.integers(0, 9))
        if pick < 7 and options:
            option = draw(st.sampled_from(options))
            tokens.append(draw(st.sampled_from(option.opts)))
            if not option.is_flag:
                tokens.append(draw(_values(corpus, verb, option)))
        elif pick < 8 and arguments:
            tokens.append(draw(_values(corpus, verb, draw(st.sampled_from(arguments)))))
        else:
            tokens.append(draw(EXTRA | STRINGS))
    tokens = [t for t in tokens if t not in FOREVER.get(verb, ())]
    if verb == ("submit",) and "--wait" in tokens:
        tokens += ["--timeout", "0.01"]  # a valid spec waits for no worker
    if verb == ("fake-endpoint",):
        tokens = ["--port", str(corpus.busy_port), *tokens]  # its default port may be free
    tokens += REFUSED_LAST.get(verb, [])
    root = ["--debug"] if draw(st.integers(0, 9)) == 0 else []
    return [*root, *verb, *tokens]


class Hung(BaseException):
    """A verb ran past its alarm (BaseException: the CLI's boundary does not catch it)."""


@contextmanager
def alarm(seconds: float, argv: list[str]) -> Iterator[None]:
    def ring(signum: int, frame: FrameType | None) -> None:
        raise Hung(f"still running after {seconds:g}s: {argv!r}")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check(result: Result, argv: list[str]) -> None:
    """The documented code, one problem line at most, no traceback (unless --debug).

    `ops detect` and `ops verify` name each unusable input on a line of its own, and a
    verb asked for --json may say its problem in the JSON instead (`cancel` of an
    unknown job)."""
    shown = (argv, result.exit_code, result.stderr[-3000:])
    debug = argv[:1] == ["--debug"]
    assert result.exit_code in DOCUMENTED, shown
    assert "internal error" not in result.stderr, shown
    if not debug:
        assert "Traceback" not in result.stderr, shown
        assert result.exception is None or isinstance(result.exception, SystemExit), shown
    lines = stderr_lines(result.stderr)
    ours = [line for line in lines if line.startswith("error: ")]
    clicks = [line for line in lines if line.startswith("Error: ")]
    per_input = argv[int(debug) : int(debug) + 2] in (["ops", "detect"], ["ops", "verify"])
    allowed = len(argv) if per_input else 1
    assert len(ours) <= allowed and len(clicks) <= 1, shown
    if result.exit_code == 2 and not debug and "--json" not in argv:
        assert 1 <= len(ours) + len(clicks) <= allowed, shown


@pytest.fixture
def corpus(tmp_path: Path) -> Iterator[Corpus]:
    root = tmp_path / "corpus"
    (root / "dir").mkdir(parents=True)
    spec = {"job_id": "fuzz-ok", "repo": str(root / "missing-repo"),
            "planner": {"kind": "scripted", "steps": [{"tool": "git_status"}]}}  # fmt: skip
    (root / "valid.json").write_text(json.dumps(spec))
    (root / "invalid.json").write_text(json.dumps({**spec, "max_steps": True}))
    (root / "bad.json").write_text("{not json")
    (root / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (root / "script.json").write_text(json.dumps([{"final": "done"}]))
    (root / "empty.json").write_text("[]")
    clean_log(root / "clean.jsonl", 30)
    (root / "incident.jsonl").write_bytes(result_line("ghost", 1, "k", slot="S-ghost") + b"\n")
    (root / "garbage.bin").write_bytes(bytes(range(256)))
    webhook = ThreadingHTTPServer(("127.0.0.1", 0), _Accept)
    threading.Thread(target=webhook.serve_forever, daemon=True).start()
    try:
        with socket.socket() as busy, refusing_port() as closed:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            url = f"http://127.0.0.1:{webhook.server_address[1]}/api/v2/alerts"
            yield Corpus(root, busy.getsockname()[1], closed, url)
    finally:
        webhook.shutdown()
        webhook.server_close()


class _Accept(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass  # no line per page on the test's stderr


@pytest.fixture
def db15(settings: Settings) -> Iterator[tuple[dict[str, str], redis.Redis]]:
    """The CLI's environment on database 15 of the session's Redis, with three jobs."""
    url = (settings.redis_url or "").rsplit("/", 1)[0] + "/15"
    client = redis.Redis.from_url(url, decode_responses=True)
    before = set(client.keys("*"))
    for job_id, state in (("done-1", "succeeded"), ("failed-1", "failed")):
        result = JobResult(job_id=job_id, state=state, attempt=1)  # type: ignore[arg-type]
        client.set(keys.job_result(job_id), result.model_dump_json())
    client.set(keys.job_state("queued-1"), "queued")
    env = {
        **settings.to_env(),
        "REDIS_URL": url,
        "SLOTRUNNER_SANDBOX": "off",  # tools table: no bwrap self-test per example
        "SLOTRUNNER_TOKEN": "",
    }
    try:
        yield env, client
    finally:
        created = set(client.keys("*")) - before
        if created:
            client.delete(*created)
        client.close()


def test_every_verb_with_generated_arguments(
    corpus: Corpus, db15: tuple[dict[str, str], redis.Redis]
) -> None:
    """Generated vectors over every verb and sub-verb: documented exit codes only, one
    problem line at most, no traceback."""
    live, _ = db15
    closed = {**live, "REDIS_URL": f"redis://127.0.0.1:{corpus.closed_port}/0"}
    live = {**live, "SLOTRUNNER_TOOLSERVER_URL": f"http://127.0.0.1:{corpus.busy_port}"}
    seen: set[tuple[str, ...]] = set()

    @fuzz_settings(800)
    @given(argv=vectors(corpus))
    def one(argv: list[str]) -> None:
        verb = tuple(a for a in argv if a != "--debug")[:2]
        verb = verb if verb in COMMANDS else verb[:1]
        seen.add(verb)
        env = closed if verb in CLOSED_REDIS else live
        with alarm(30, argv):
            result = CliRunner().invoke(main, argv, env=env, input="", prog_name="slotrunner")
        check(result, argv)

    one()
    assert seen == set(COMMANDS), set(COMMANDS) - seen


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["slots", "list", "--watch", "--interval", "nan"], "--interval"),
        (["slots", "list", "--watch", "--interval", "-1"], "--interval"),
        (["slots", "lease", "--job", "job-a", "--attempt", "0"], "--attempt"),
        (["slots", "lease", "--job", "job-a", "--wait", "nan"], "--wait"),
        (["slots", "release", "--slot", "S0", "--job", "a\nb", "--generation", "1"], "--job"),
        (["submit", "-", "--wait", "--timeout", "nan"], "--timeout"),
        (["toolserver", "--max-concurrent", "-1"], "--max-concurrent"),
        (["toolserver", "--port", "70000"], "--port"),
        (["worker", "--concurrency", "0"], "--concurrency"),
        (["harness", "sweep", "--url", "http://127.0.0.1:1", "--timeout-s", "nan"], "--timeout-s"),
        # Each refused argument comes first: were it taken, the next refusal would name
        # another option (and nothing would start either way).
        (["chaos", "--seed", "1", "--timeout", "inf", "--jobs", "0"], "--timeout"),
        (["demo", "--timeout", "nan", "--jobs", "0"], "--timeout"),
    ],
)
def test_arguments_that_once_hung_or_crashed_are_usage_errors(
    db15: tuple[dict[str, str], redis.Redis], argv: list[str], option: str
) -> None:
    """NaN and infinite seconds, attempts below 1, ports past 65535, a semaphore of -1:
    each a click usage error naming the option, before anything runs."""
    env, _ = db15
    with alarm(30, argv):
        result = CliRunner().invoke(main, argv, env=env, input="", prog_name="slotrunner")
    check(result, argv)
    assert result.exit_code == 2 and option in result.stderr, result.stderr


def test_named_problems_that_were_internal_errors(
    corpus: Corpus, db15: tuple[dict[str, str], redis.Redis]
) -> None:
    """A taken port (uvicorn logged it and exited 3), a URL httpx cannot parse, a job id
    no key can have: one `error:` line each, exit 2."""
    env, _ = db15
    env = {**env, "SLOTRUNNER_TOOLSERVER_URL": f"http://127.0.0.1:{corpus.busy_port}"}
    closed = f"http://127.0.0.1:{corpus.closed_port}"
    cases: list[tuple[list[str], str]] = [
        (["toolserver"], f"cannot bind 127.0.0.1:{corpus.busy_port}"),
        (["ops", "detect", "--webhook", "http://[::1", corpus.path("clean.jsonl")], "--webhook"),
        (["harness", "sweep", "--url", "http://[::1"], "is not a URL"),
        (["result", "\udcff"], "is not a job id"),
        (["result", "a" * 300], "is not a job id"),
    ]
    for argv, needle in cases:
        with alarm(30, argv):
            result = CliRunner().invoke(main, argv, env=env, input="", prog_name="slotrunner")
        check(result, argv)
        assert result.exit_code == 2 and needle in result.stderr, (argv, result.stderr)
    # Incidents paged to a webhook that never answers: the verdict, and one line for the
    # pages (once one line for each failed delivery, and another at the end).
    argv = ["ops", "detect", "--webhook", closed, corpus.path("incident.jsonl")]
    with alarm(60, argv):
        paged = CliRunner().invoke(main, argv, env=env, input="", prog_name="slotrunner")
    check(paged, argv)
    assert paged.exit_code == 1
    assert stderr_lines(paged.stderr) == [
        line for line in stderr_lines(paged.stderr) if "some pages were not delivered: " in line
    ]
