"""A slot directory for the receipt store's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def slot(tmp_path: Path) -> Path:
    path = tmp_path / "slots" / "s1"
    path.mkdir(parents=True)
    return path
