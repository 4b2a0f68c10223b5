"""Shared pieces of the property-based tests of every door (issue #15): hypothesis settings
that replay the same examples on every run, hostile values, and the checks on what a
command printed."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st


def fuzz_settings(max_examples: int) -> settings:
    """Bounded, the same examples on every run (no example database, no random seed),
    no deadline (the doors do real I/O), function-scoped fixtures allowed (each test
    builds its real stack once, outside the examples)."""
    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


# Text a JSON document can carry: anything but lone surrogates (no UTF-8 encoder takes
# them; the doors that read raw bytes are given those separately).
TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
# Strings that have broken parsers before: control characters, a trailing newline,
# NUL, a leading dash, traversal, very long, Unicode look-alikes and markup.
HOSTILE = st.sampled_from(
    [
        "",
        " ",
        "\n",
        "abc\n",
        "a\x00b",
        "\x1b[31mred",
        "-rf",
        "--upload-pack=touch /tmp/pwned",
        "../../etc/passwd",
        ".",
        "./",
        ".git",
        ".git/HEAD",
        "a/../..",
        "README/",
        "/etc/passwd",
        "a" * 5000,
        "\u202egnp.exe",
        "\uff41\uff42\uff43",  # fullwidth abc
        "[bold]x[/]",
        "{x}",
        "%s%n",
        "\t",
        "NaN",
        "1e309",
        "0",
        "-1",
        "true",
        "null",
    ]
)
STRINGS = HOSTILE | TEXT
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | STRINGS
)
# Any JSON value, nested a few levels deep.
JSON: st.SearchStrategy[Any] = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


def nested(depth: int, inner: Any = None) -> Any:
    """A JSON value ``depth`` lists deep (built without recursion)."""
    value = inner
    for _ in range(depth):
        value = [value]
    return value


def stderr_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]
