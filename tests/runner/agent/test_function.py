"""What a python agent function returns becomes the job result's ``agent.returned``."""

from __future__ import annotations

from runner.agent.function import RETURNED_CHARS, result_value


def test_json_of_bounded_size_is_kept_as_it_is() -> None:
    """A mapping of plain values is kept whole."""
    value = {"exit_status": "Submitted", "submission": "diff --git a/x b/x\n", "n": [1, 2]}
    assert result_value(value) == value


def test_what_json_cannot_hold_is_its_repr() -> None:
    """An object JSON cannot encode is recorded as its repr, not dropped or raised."""
    assert result_value({1, 2}) == repr({1, 2})


def test_a_large_value_is_cut_to_the_limit() -> None:
    """A value over the limit is its repr, cut, so a result stays small."""
    cut = result_value("x" * (RETURNED_CHARS * 2))
    assert isinstance(cut, str) and len(cut) == RETURNED_CHARS
