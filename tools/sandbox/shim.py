"""How the child takes its limits before it becomes the command: ``prlimit``, or a shim.

No ``preexec_fn``, which can deadlock a threaded server (uvicorn, Celery) between fork
and exec: the child execs a small program that sets the rlimits and then execs the
command. That program is util-linux's ``prlimit`` when the host has it (a C program:
the child starts in a millisecond or two, see ``bench/exec_start.py``), else a tiny
Python shim (some 20 ms of interpreter start-up). Each limit is capped at this
process's own hard limit, which the child inherits: it may lower a limit, never raise
one. With a pids cgroup the child first writes its own pid into ``cgroup.procs``, so
everything it starts is in the cgroup from its first fork.

Python ignores SIGPIPE and SIGXFSZ, and an ignored signal survives exec: Popen's
``restore_signals`` (on by default) sets them back in the child, and the Python shim
does it again itself, so a command past its file-size limit dies as anywhere else.
"""

from __future__ import annotations

import functools
import resource
import shutil
import sys
from collections.abc import Sequence

from tools.sandbox.policy import DEFAULT_PATH

# policy.rlimits' names, as prlimit spells them.
PRLIMIT_OPTIONS = {
    "RLIMIT_CPU": "cpu",
    "RLIMIT_AS": "as",
    "RLIMIT_NOFILE": "nofile",
    "RLIMIT_FSIZE": "fsize",
    "RLIMIT_CORE": "core",
    "RLIMIT_NPROC": "nproc",
}
# Join the cgroup, then become prlimit: the shell's pid is the child's.
_JOIN = 'echo $$ > "$1" || exit 126; shift; exec "$@"'

_SHIM = """\
import os, resource, signal, sys
procs, spec, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
for sig in (signal.SIGPIPE, signal.SIGXFSZ):
    signal.signal(sig, signal.SIG_DFL)
try:
    if procs:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    for row in filter(None, spec.split(",")):
        name, soft, hard = row.split(":")
        resource.setrlimit(getattr(resource, name), (int(soft), int(hard)))
except OSError as e:
    sys.stderr.write("slotrunner sandbox: cannot apply limits: %s\\n" % e)
    os._exit(126)
try:
    os.execvp(argv[0], argv)
except OSError as e:
    sys.stderr.write("slotrunner sandbox: cannot execute %r: %s\\n" % (argv[0], e))
    os._exit(127)
"""


@functools.cache
def find_prlimit() -> str | None:
    """util-linux's prlimit among the system's directories (not the caller's PATH)."""
    return shutil.which("prlimit", path=DEFAULT_PATH)


def capped(rows: Sequence[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """Each (name, soft, hard) lowered to this process's hard limit, when it has one."""
    out = []
    for name, soft, hard in rows:
        cap = resource.getrlimit(getattr(resource, name))[1]
        if cap != resource.RLIM_INFINITY:
            soft, hard = min(soft, cap), min(hard, cap)
        out.append((name, soft, hard))
    return out


def child_argv(
    command: Sequence[str],
    rows: Sequence[tuple[str, int, int]],
    procs: str | None,
    prlimit: str | None,
) -> list[str]:
    """The argv that joins ``procs`` (a cgroup.procs file), sets ``rows``, runs ``command``."""
    limits = capped(rows)
    if prlimit is None:
        spec = ",".join(f"{n}:{s}:{h}" for n, s, h in limits)
        return [sys.executable, "-I", "-S", "-c", _SHIM, procs or "", spec, *command]
    argv = [prlimit, *(f"--{PRLIMIT_OPTIONS[n]}={s}:{h}" for n, s, h in limits), "--"]
    argv += command
    return ["/bin/sh", "-c", _JOIN, "sh", procs, *argv] if procs else argv
