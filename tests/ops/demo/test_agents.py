"""ops.demo.agents: which example each `demo --agent` choice runs, the job specs it
makes of it, and the one-line errors when the example or the framework is missing."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from ops.demo.agents import EXAMPLES, FRAMEWORKS, AgentDemoError, check, make_specs
from runner.cli.errors import EXIT_ERROR, describe
from runner.jobs.submit import parse_spec


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_each_spec_is_the_example_on_a_repository_of_its_own(name: str, tmp_path: Path) -> None:
    """Job i: the example's spec with its own id, the run's eval-run, and a fresh git
    repository holding the example's sample at its base; it passes submit's checks."""
    framework = check(name)
    specs = make_specs(framework, tmp_path, "r1", 2)
    example = json.loads((EXAMPLES / framework.example / framework.job_file).read_text())
    assert [s["job_id"] for s in specs] == ["demo-r1-00", "demo-r1-01"]
    assert len({s["repo"] for s in specs}) == 2
    for spec in specs:
        assert spec["planner"] == example["planner"] and spec["eval_run"] == "demo-r1"
        parse_spec(spec)
        files = subprocess.run(
            ["git", "ls-tree", "--name-only", spec["base"]],
            cwd=spec["repo"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        assert files == sorted(p.name for p in (EXAMPLES / framework.sample).iterdir())
    specs[0]["planner"]["kind"] = "changed"
    assert specs[1]["planner"]["kind"] == example["planner"]["kind"]  # copies, not shared


def test_no_example_is_one_line_naming_the_missing_file(tmp_path: Path) -> None:
    with pytest.raises(AgentDemoError) as raised:
        check("mcp", examples=tmp_path)
    code, line = describe(raised.value)
    assert code == EXIT_ERROR and "\n" not in line
    assert line.startswith("error: slotrunner demo --agent mcp runs the example")
    assert str(tmp_path / "mcp_command_agent" / "job.json") in line


def test_no_framework_package_is_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    needs = dataclasses.replace(FRAMEWORKS["mcp"], packages=("no_such_framework_pkg",))
    monkeypatch.setitem(FRAMEWORKS, "mcp", needs)
    with pytest.raises(AgentDemoError) as raised:
        check("mcp")
    code, line = describe(raised.value)
    assert code == EXIT_ERROR and "\n" not in line
    assert "needs no_such_framework_pkg: install the agents extra" in line
