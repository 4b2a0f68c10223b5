"""The dependency contracts of pyproject.toml hold on the tree, and fail on a back edge."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.support.importgraph import PACKAGES, cycles_under, lint_imports, module_cycles
from tests.support.repos import REPO

CONFIG: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"][
    "importlinter"
]


def _contract(contract_id: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in CONFIG["contracts"] if c["id"] == contract_id)
    return found


def _layer_modules(contract: dict[str, Any]) -> set[str]:
    """The modules a layers contract names, prefixed by its containers if it has any."""
    tails = {
        name.strip().strip("()")
        for layer in contract["layers"]
        for name in layer.replace("|", ":").split(":")
    }
    return {f"{c}.{t}" for c in contract.get("containers", []) for t in tails} or tails


def _named_modules() -> set[str]:
    named: set[str] = set()
    for contract in CONFIG["contracts"]:
        if contract["type"] == "layers":
            named |= _layer_modules(contract)
        named |= set(contract.get("source_modules", ())) | set(contract.get("ancestors", ()))
        named |= set(contract.get("forbidden_modules", ()))
        named |= set(contract.get("protected_modules", ())) | set(
            contract.get("allowed_importers", ())
        )
    return named


def _runner_parts() -> set[str]:
    root = REPO / "runner"
    packages = {p.parent.name for p in root.glob("*/__init__.py")}
    modules = {p.stem for p in root.glob("*.py") if p.name != "__init__.py"}
    return {f"runner.{name}" for name in packages | modules}


# -- the tree as it is -----------------------------------------------------------------


@pytest.mark.timeout(180)
def test_the_tree_keeps_every_contract() -> None:
    """`lint-imports` on the checkout: every contract of [tool.importlinter] is kept."""
    proc = lint_imports(REPO)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_no_module_of_the_packages_is_in_an_import_cycle() -> None:
    """No set of modules of runner, tools, hooks and ops imports each other in a circle."""
    assert module_cycles(PACKAGES) == []


def test_the_contracts_place_every_part_of_runner() -> None:
    """A new subpackage of runner cannot slip past the layers and the tools contract."""
    parts = _runner_parts()
    layered = {m for m in _layer_modules(_contract("layers")) if m.startswith("runner.")}
    assert layered == parts
    forbidden_to_tools = set(_contract("tools-core-only")["forbidden_modules"])
    assert forbidden_to_tools == (parts - {"runner.core", "runner.errors"}) | {"hooks", "ops"}


# -- the contracts can fail --------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Empty packages for every module the contracts name, and the same pyproject.toml."""
    for name in _named_modules():
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):
            package = tmp_path.joinpath(*parts[:depth])
            package.mkdir(exist_ok=True)
            (package / "__init__.py").touch()
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _write(root: Path, path: str, text: str) -> None:
    (root / path).write_text(text)


@pytest.mark.timeout(180)
def test_the_empty_tree_keeps_the_contracts(tree: Path) -> None:
    """Without an edge the contracts hold, so each failure below is its edge's doing."""
    proc = lint_imports(tree)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert cycles_under(tree) == []


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("path", "text", "named"),
    [
        ("tools/lock.py", "import runner.slots\n", "tools.lock -> runner.slots"),
        ("tools/hook.py", "from hooks import celery_hooks\n", "tools.hook -> hooks"),
        ("runner/cli/plugins.py", "import ops\n", "runner.cli.plugins -> ops"),
        ("runner/worker/hook.py", "import hooks\n", "runner.worker.hook -> hooks"),
        ("runner/jobs/copy.py", "import runner.worker\n", "runner.jobs.copy -> runner.worker"),
        ("runner/core/stamp.py", "import tools\n", "runner.core.stamp -> tools"),
        (
            "runner/agent/api.py",
            "import runner.agent.adapters\n",
            "runner.agent.api -> runner.agent.adapters",
        ),
    ],
)
def test_a_back_edge_breaks_the_contracts(tree: Path, path: str, text: str, named: str) -> None:
    """An import against the layers fails `lint-imports`, which names the importing line."""
    _write(tree, path, text)
    proc = lint_imports(tree)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert named in proc.stdout
    assert "BROKEN" in proc.stdout


@pytest.mark.timeout(180)
def test_a_cycle_between_modules_breaks_the_contracts(tree: Path) -> None:
    """Two modules of tools importing each other: lint-imports and the module check fail."""
    _write(tree, "tools/reasons.py", "import tools.envelope\n")
    _write(tree, "tools/envelope.py", "from tools import reasons\n")
    proc = lint_imports(tree)
    assert proc.returncode == 1, proc.stdout[-4000:]
    assert "No cycles are allowed in tools." in proc.stdout
    assert cycles_under(tree) == [["tools.envelope", "tools.reasons"]]


@pytest.mark.timeout(180)
def test_a_package_and_its_own_module_in_a_cycle_are_found(tree: Path) -> None:
    """A package __init__ and a module inside it: no sibling contract sees it, the module
    check does."""
    _write(tree, "runner/jobs/__init__.py", "from runner.jobs.models import JobSpec\n")
    _write(tree, "runner/jobs/models.py", "import runner.jobs\nJobSpec = object\n")
    assert cycles_under(tree) == [["runner.jobs", "runner.jobs.models"]]
