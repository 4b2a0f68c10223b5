"""The ops package's error tree (skeleton: filled in as the package's errors move here).

    OpsError
"""

from __future__ import annotations


class OpsError(Exception):
    """Base of every error the ops package raises on purpose."""
