"""The tools package's error tree (skeleton: filled in as the package's errors move here).

    ToolError            a refusal or failure carrying its ``Reason``
"""

from __future__ import annotations

from tools.reasons import ToolError

__all__ = ["ToolError"]
