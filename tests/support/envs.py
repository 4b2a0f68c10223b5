"""Environments of a test's home, planned from a real git repository (runner/envs/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ops.demo.sample_repo import commit_files
from runner.core.settings import Settings
from runner.envs.build import Plan, plan
from runner.jobs.models import EnvironmentSpec
from runner.workspace.cache import mirror_of
from runner.workspace.source import parse_source
from runner.workspace.workspaces import Workspaces


def plan_for(
    settings: Settings, repo: Path, base: str, setup: list[list[str]], **spec: Any
) -> Plan:
    """The plan a job on ``repo`` at ``base`` with this ``environment`` block would make."""
    caches = Workspaces(settings.home).caches
    src = parse_source(str(repo))
    with caches.lock(caches.cache_path(src)):
        cache, fresh = caches.ensure_cache(src)
        base = caches.resolve_base(cache, str(repo), base, fresh)  # fetched, as a job's prepare
    environment = EnvironmentSpec.model_validate({"setup": setup, **spec})
    return plan(
        settings,
        environment,
        repo=str(repo),
        source_key=parse_source(str(repo)).key,
        mirror=mirror_of(cache),
        base_commit=base,
    )


def commit_file(repo: Path, name: str, text: str) -> str:
    """Commit ``name`` with ``text`` on top of ``repo``'s HEAD; the new commit id."""
    return commit_files(repo, {name: text}, f"change {name}")
