"""`slotrunner demo --real`, as a new user runs it: six's real source from the package
index, three agent jobs sharing one environment built once, a summary that says so."""

from __future__ import annotations

import io
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from ops.demo.six_source import VERSION, RealDemoError, extract
from tests.ops.demo.test_demo import run_demo


def summary_rows(stdout: str) -> dict[str, list[str]]:
    """The summary table's rows by plan name: [job, plan, state, environment, tests,
    time, as expected]."""
    rows = [
        [cell.strip() for cell in line.strip("│ \n").split("│")]
        for line in stdout.splitlines()
        if line.startswith("│ demo-")
    ]
    return {row[1]: row for row in rows}


def test_real_demo_builds_the_environment_once_and_each_job_ends_as_planned(
    tmp_path: Path, redis_url: str
) -> None:
    """One job runs six's tests (they pass), one breaks byte2int (test_byte2int fails,
    the job fails as planned), one breaks and fixes it (they pass). One of them built
    the venv, the other two reused it; the summary says setup ran once; exit 0."""
    proc = run_demo(tmp_path, redis_url, "--real")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    rows = summary_rows(out)
    assert sorted(rows) == ["break", "break-fix", "tests"], out
    assert [rows[p][2] for p in ("tests", "break", "break-fix")] == [
        "succeeded",
        "failed",
        "succeeded",
    ], out
    assert all(row[6] == "yes" for row in rows.values()), out
    for plan in ("tests", "break-fix"):
        passed = re.fullmatch(r"(\d+) passed", rows[plan][4])
        assert passed is not None and int(passed.group(1)) > 100, rows[plan]
    broken = re.fullmatch(r"(\d+) passed, 1 failed: test_six.py::test_byte2int", rows["break"][4])
    assert broken is not None and int(broken.group(1)) > 100, rows["break"]
    environments = sorted(row[3].split(" ")[0] for row in rows.values())
    assert environments == ["built", "reused", "reused"], out
    line = re.search(r"^environment ([0-9a-f]{24}): built in [\d.]+ s by (\S+), reused by 2 jobs; "
                     r"setup ran once$", out, re.MULTILINE)  # fmt: skip
    assert line is not None, out
    key, builder = line.groups()
    assert rows[next(p for p, r in rows.items() if r[3].startswith("built"))][0] == builder
    # The build was shown while it ran: the job's phase, step by step.
    assert f"building environment {key}: step 1/2" in out
    assert f"building environment {key}: step 2/2" in out
    assert "jobs as expected: 3 of 3" in out
    # On disk: one environment in the home's store, and the repository the jobs
    # worked on holds six's source without its egg-info.
    home = tmp_path / "home"
    assert [p.name for p in (home / "envs").iterdir() if (p / "meta.json").is_file()] == [key]
    (repo,) = (home / "demo").glob("*/six-1.17.0")
    files = subprocess.run(
        ["git", "ls-files"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.split()
    assert {"six.py", "test_six.py", "setup.py"} <= set(files)
    assert not [f for f in files if "egg-info" in f]


def test_a_download_that_fails_is_one_line_naming_the_project(
    tmp_path: Path, redis_url: str
) -> None:
    """With pip pointed at an empty local index only, the demo stops before starting
    anything: exit 2 and one line that names the requirement and pip's reason."""
    empty = tmp_path / "no-packages"
    empty.mkdir()
    proc = run_demo(
        tmp_path,
        redis_url,
        "--real",
        extra_env={
            "PIP_CONFIG_FILE": "/dev/null",
            "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": str(empty),
        },
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith("error: could not download six==1.17.0 from the package index")
    assert "No matching distribution" in errors[0]
    assert not (tmp_path / "home" / "envs").exists()  # no worker ran, nothing was built


def test_real_takes_no_other_mode(tmp_path: Path, redis_url: str) -> None:
    """--real is its own run: with --agent, --incident, --planner or --jobs it is a
    usage error, before anything is downloaded."""
    proc = run_demo(tmp_path, redis_url, "--real", "--incident")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--real takes none of --agent, --incident, --planner, --jobs" in proc.stderr
    assert not (tmp_path / "home" / "demo").exists()


def _sdist(path: Path, extra: tarfile.TarInfo, data: bytes = b"") -> Path:
    """A tarball shaped like six's sdist, with one more member."""
    with tarfile.open(path, "w:gz") as tar:
        for name in ("six.py", "test_six.py", "six.egg-info/PKG-INFO"):
            body = f"# {name}\n".encode()
            info = tarfile.TarInfo(f"six-{VERSION}/{name}")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
        tar.addfile(extra, io.BytesIO(data) if extra.isfile() else None)
    return path


def test_extract_drops_egg_info_and_refuses_links_and_escapes(tmp_path: Path) -> None:
    """The sdist's files land without its top directory or egg-info; a member that is
    a link, or whose path leaves the top directory, refuses the whole archive."""
    readme = tarfile.TarInfo(f"six-{VERSION}/README.rst")
    readme.size = 3
    good = _sdist(tmp_path / "good.tar.gz", readme, b"hi\n")
    extract(good, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "README.rst",
        "six.py",
        "test_six.py",
    ]
    link = tarfile.TarInfo(f"six-{VERSION}/evil")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    escape = tarfile.TarInfo(f"six-{VERSION}/../evil.py")
    escape.size = 1
    for number, member in enumerate((link, escape)):
        bad = _sdist(tmp_path / f"bad{number}.tar.gz", member, b"x")
        with pytest.raises(RealDemoError) as caught:
            extract(bad, tmp_path / f"bad-out{number}")
        assert repr(member.name) in str(caught.value)
        assert not (tmp_path / "evil.py").exists()
        assert not (tmp_path / f"bad-out{number}" / "evil").exists()
