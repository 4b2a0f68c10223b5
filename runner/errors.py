"""The runner package's error tree (skeleton: filled in as the package's errors move here).

    RunnerError
"""

from __future__ import annotations


class RunnerError(Exception):
    """Base of every error the runner package raises on purpose."""
