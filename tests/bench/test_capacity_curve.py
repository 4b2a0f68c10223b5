"""The capacity curve's rules (bench/capacity_curve.py): where the knee falls, and
which process the "why" names, from the cores each side kept busy."""

from __future__ import annotations

import pytest

from bench.capacity_curve import find_knee, why


@pytest.mark.parametrize(
    ("points", "knee"),
    [
        ([(1, 100.0), (2, 190.0), (4, 200.0), (8, 205.0)], 2),  # 4 gains 5 %: knee at 2
        ([(1, 100.0), (2, 109.0), (4, 300.0)], 1),  # the first flat doubling decides
        ([(1, 100.0), (2, 200.0), (4, 400.0)], None),  # still growing: no knee
        ([(1, 100.0), (2, 80.0)], 1),  # a drop is past the knee too
        ([(1, 100.0)], None),
    ],
)
def test_the_knee_is_the_first_level_whose_doubling_gains_under_ten_percent(
    points: list[tuple[int, float]], knee: int | None
) -> None:
    assert find_knee(points) == knee


def side(server: float, client: float, host: float) -> dict[str, float]:
    return {
        "server_cores": server,
        "client_cores": client,
        "host_cores": host,
        "server_cpu_ms_per_op": 4.8,
    }


@pytest.mark.parametrize(
    ("busy", "named"),
    [
        (side(0.95, 0.30, 1.30), "the tool server is CPU-bound"),
        (side(0.40, 0.95, 1.40), "the client is CPU-bound, not the tool server"),
        (side(0.95, 0.95, 1.95), "both sides are CPU-bound"),
        (side(0.30, 0.30, 1.90), "most of them with other processes"),
        (side(0.30, 0.30, 0.70), "no process is CPU-bound"),
    ],
)
def test_why_names_the_side_that_held_the_rate(busy: dict[str, float], named: str) -> None:
    assert named in why(busy, 2, "tool server", "client")
