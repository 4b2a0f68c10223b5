"""What the benchmark smoke tests share: a quick run of some benchmarks in a child."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def quick_run(tmp_path: Path, only: str) -> tuple[dict[str, Any], str]:
    """`bench.run --quick --only ONLY`, which must exit 0: its JSON document and Markdown."""
    out, md = tmp_path / "results.json", tmp_path / "RESULTS.md"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--only", only,
         "--json-out", str(out), "--md-out", str(md)],
        cwd=REPO, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), md.read_text()
