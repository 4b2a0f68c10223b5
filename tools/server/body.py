"""Decoding a tool call's JSON body, with a bound on how deeply it may nest.

``json.loads`` recurses once per level of nesting: a body of 100,000 ``[`` raises
``RecursionError`` from inside the decoder. That is caught here and answered as what it
is, a malformed body, and so is any body nesting past :data:`MAX_JSON_DEPTH` (a call's
body is three levels deep; the bound is far above any real one, and far below the
interpreter's own), so the limit is one number, not the depth of the server's stack.
"""

from __future__ import annotations

import json
from typing import Any

MAX_JSON_DEPTH = 32


def decode(body: bytes) -> tuple[Any, str | None]:
    """The decoded body and None, or None and why the body is refused (422 malformed)."""
    try:
        payload = json.loads(body)
    except RecursionError:
        return None, _too_deep()
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"the body is not JSON: {exc}"
    # Only a body with that many brackets can nest that deep: most are not walked at all.
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH and deeper_than(
        payload, MAX_JSON_DEPTH
    ):
        return None, _too_deep()
    return payload, None


def deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists or dicts more than ``limit`` levels (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list):
            continue
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _too_deep() -> str:
    return f"the body nests arrays or objects more than {MAX_JSON_DEPTH} levels deep"
