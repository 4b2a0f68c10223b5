"""The slots of a real tool server's home that the exec tests lease and call into."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.execslots import Slots
from tests.support.repos import make_repo
from tests.support.toolserver import ToolServer


@pytest.fixture
def slots(toolserver: ToolServer, tmp_path: Path) -> Iterator[Slots]:
    repo = tmp_path / "repo"
    found = Slots(toolserver.settings, repo, make_repo(repo))
    try:
        yield found
    finally:
        found.close()
