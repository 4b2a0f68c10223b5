"""The benchmarks' pairing of arms: blocks that rotate, and single calls in turn."""

from __future__ import annotations

from collections.abc import Callable

from bench.stats import Run, alternate, alternate_reps, cost_ratio, interleave, timed


def test_alternate_calls_the_arms_in_turn_flipping_the_order_each_round() -> None:
    """Round 0 is A B, round 1 B A, ...; every op runs n times and is timed on its own."""
    calls: list[tuple[str, int]] = []
    runs = alternate(
        4, {"a": lambda i: calls.append(("a", i)), "b": lambda i: calls.append(("b", i))}
    )
    assert calls == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2), ("b", 3), ("a", 3)]
    for run in runs.values():
        assert run.ops == 4 and len(run.op_s) == 4
        assert run.wall_s == sum(run.op_s)


def test_alternate_times_each_arm_apart() -> None:
    """An arm that does more work per call shows a higher cost than its partner."""
    runs = alternate(6, {"heavy": lambda _: sum(range(200_000)), "light": lambda _: sum(range(10))})
    ratio, low, _high = cost_ratio([runs["heavy"]], [runs["light"]])
    assert ratio == low and ratio > 1.0


def test_alternate_reps_gives_one_run_per_arm_per_repetition() -> None:
    """Each repetition is its own alternation; the runs come per arm, as interleave's."""
    calls: list[str] = []
    arms = {"a": lambda _: calls.append("a"), "b": lambda _: calls.append("b")}
    runs = alternate_reps(3, 2, arms)
    assert calls == ["a", "b", "b", "a"] * 3
    assert list(runs) == ["a", "b"]
    assert all(len(arm) == 3 and all(run.ops == 2 for run in arm) for arm in runs.values())


def test_interleave_rotates_the_block_order() -> None:
    """Each repetition starts one arm later: AB, BA, ..."""
    order: list[str] = []

    def arm(name: str) -> Callable[[int], Run]:
        def one(_: int) -> Run:
            order.append(name)
            return timed(1, lambda _: None)

        return one

    runs = interleave(3, {"a": arm("a"), "b": arm("b")})
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert [len(r) for r in runs.values()] == [3, 3]
