"""Render a run's JSON document as ``RESULTS.md``: machine, goals, figures, method."""

from __future__ import annotations

import itertools
from typing import Any

_KNOWN = {"p50_ms": "p50 ms", "p99_ms": "p99 ms", "ops_per_s": "{unit}"}
_SKIP = {"runs", "ops_per_run"}


def _num(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    return str(value)


def _share(value: object) -> str:
    return f"{value * 100:.1f} %" if isinstance(value, float) else "unknown"


def _load(values: object) -> str:
    return ", ".join(str(v) for v in values) if isinstance(values, list) else "-"


def _verdict(met: bool | None) -> str:
    if met is None:
        return "-"
    return "**met**" if met else "**not met**"


def _beside_floor(fig: dict[str, Any]) -> str:
    """What follows a goal's verdict when the figure has a floor (bench.stats.Floor)."""
    floor = fig.get("floor")
    if not floor:
        return ""
    within = "yes" if floor["within"] else "no"
    return (
        f"; floor {_num(floor['value'])} measured, figure at {_num(floor['ratio'])}x of the "
        f"floor (within {_num(floor['bound'])}x: {within})"
    )


def _floor_rows(floor: dict[str, Any]) -> list[str]:
    spread = floor.get("spread")
    extra = f" (pairs: {_num(spread[0])} .. {_num(spread[1])})" if spread else ""
    lines = [
        f"- floor {floor['name']}, {floor['what']}: **{_num(floor['value'])}** on the goal's "
        f"scale; figure at **{_num(floor['ratio'])}x**{extra} of it: {floor['ratio_means']}; "
        f"within {_num(floor['bound'])}x of the floor: **{'yes' if floor['within'] else 'no'}**"
    ]
    if floor.get("note"):
        lines.append(f"- {floor['note']}")
    return lines


def _figure_rows(fig: dict[str, Any]) -> list[str]:
    subject, baseline = fig.get("subject"), fig.get("baseline")
    if subject is None and baseline is None:
        return [f"*{fig.get('note') or 'not measured'}*", ""]
    keys: list[str] = []
    for side in (subject, baseline):
        for key in side or {}:
            if key not in keys and key not in _SKIP:
                keys.append(key)
    heads = [_KNOWN.get(k, k).format(unit=fig["unit"]) for k in keys]
    lines = [
        "| arm | what | " + " | ".join(heads) + " |",
        "|---|---|" + "---:|" * len(keys),
    ]
    for arm, label, side in (
        ("subject", fig["subject_label"], subject),
        ("baseline", fig["baseline_label"], baseline),
    ):
        if side is None:
            continue
        cells = [_num(side.get(k)) for k in keys]
        lines.append(f"| {arm} | {label} | " + " | ".join(cells) + " |")
    lines.append("")
    ratio = fig.get("ratio")
    if ratio is not None:
        spread = fig.get("spread")
        extra = f" (pairs: {_num(spread[0])} .. {_num(spread[1])})" if spread else ""
        lines.append(f"- ratio **{_num(ratio)}x**{extra}: {fig['ratio_means']}")
    if fig.get("goal"):
        value = fig.get("value")
        lines.append(
            f"- goal {fig['goal']['text']}: {fig['value_means']} = **{_num(value)}** "
            f"-> {_verdict(fig.get('met'))}{_beside_floor(fig)}"
        )
    elif fig.get("value") is not None and fig.get("value_means") != fig["ratio_means"]:
        lines.append(f"- {fig['value_means']} = **{_num(fig['value'])}** (no goal)")
    if fig.get("floor"):
        lines += _floor_rows(fig["floor"])
    if fig.get("note"):
        lines.append(f"- {fig['note']}")
    lines.append("")
    return lines


def _curve_of(fig: dict[str, Any]) -> str | None:
    """A figure named ``<curve>@<point>`` (``capacity.calls@C=4``) is one point of a curve."""
    curve, at, _ = fig["name"].partition("@")
    return curve if at else None


def _curve_rows(points: list[dict[str, Any]]) -> list[str]:
    """A curve's points as one table, a row per arm per point; the ratio on the subject's."""
    first = points[0]
    keys: list[str] = []
    for fig in points:
        for side in (fig.get("subject"), fig.get("baseline")):
            keys += [k for k in side or {} if k not in keys and k not in _SKIP]
    heads = [_KNOWN.get(k, k).format(unit=first["unit"]) for k in keys]
    lines = [first["what"], "", f"- subject: {first['subject_label']}"]
    if any(fig.get("baseline") for fig in points):
        lines.append(f"- baseline: {first['baseline_label']}")
    lines += [
        "",
        "| point | arm | " + " | ".join(heads) + " | ratio |",
        "|---|---|" + "---:|" * (len(keys) + 1),
    ]
    for fig in points:
        point = fig["name"].partition("@")[2]
        spread = fig.get("spread")
        ratio = _num(fig.get("ratio")) + (
            f" ({_num(spread[0])} .. {_num(spread[1])})" if spread else ""
        )
        for arm, side in (("subject", fig.get("subject")), ("baseline", fig.get("baseline"))):
            if side is not None:
                cells = [_num(side.get(k)) for k in keys]
                lines.append(f"| {point} | {arm} | " + " | ".join(cells) + f" | {ratio} |")
                ratio = ""  # the pair's ratio, once
    paired = any(fig.get("spread") for fig in points)
    pairs = " (in brackets: the smallest and largest pair)" if paired else ""
    lines += ["", f"- ratio: {first['ratio_means']}{pairs}"]
    lines += [f"- {fig['name']}: {fig['note']}" for fig in points if fig.get("note")]
    return [*lines, ""]


def _after_sync(machine: dict[str, Any]) -> str:
    """The host's CPU-after-sync probe (``bench.machine.cpu_after_sync``), or "-"."""
    probe = machine.get("cpu_after_sync")
    if not probe:
        return "-"
    return (
        f"{probe['busy_us']} / {probe['after_sync_us']} µs (median; {probe['ratio']}x): "
        "the receipts figures' Python runs between syncs and moves with this ratio"
    )


def render(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    out = [
        "# slotrunner benchmark results",
        "",
        "Written by `python -m bench.run` (do not edit by hand; run it again).",
        "",
        f"- command: `{doc['command']}`",
        f"- date (UTC): {m['date_utc']}",
        f"- mode: {'quick' if doc['quick'] else 'full'}; benchmarks: "
        f"{', '.join(doc['benchmarks_run'])}; total {doc['total_s']} s",
        "",
        "## Machine",
        "",
        "| fact | value |",
        "|---|---|",
        f"| nproc | {m['nproc']} |",
        f"| CPU | {m['cpu_model']} |",
        f"| memory | {_num(m.get('memory_total_mb'))} MB |",
        f"| python | {m['python']} |",
        f"| kernel | {m['kernel']} |",
        f"| git | {m.get('git') or 'missing'} |",
        f"| jq | {m.get('jq') or 'missing'} |",
        f"| bwrap | {m.get('bwrap') or 'missing'} |",
        f"| load average (1, 5, 15 min) at start | {_load(m.get('loadavg_at_start'))} |",
        f"| load average at end | {_load(m.get('loadavg_at_end'))} |",
        f"| CPU stolen by the hypervisor during the run | {_share(m.get('cpu_steal_share'))} |",
        f"| the same Python work, CPU busy / just after a synced write | {_after_sync(m)} |",
        "",
        "## Goals",
        "",
        "| benchmark | figure | goal | measured | verdict |",
        "|---|---|---|---:|---|",
    ]
    for name, res in doc["results"].items():
        if res.get("error"):
            out.append(f"| {name} | - | - | - | **not measured** (error) |")
        for fig in res["figures"]:
            if fig.get("goal") is None:
                continue
            value = fig.get("value")
            verdict = _verdict(fig.get("met")) if value is not None else "**not measured**"
            verdict += _beside_floor(fig) if value is not None else ""
            out.append(
                f"| {name} | {fig['name']} | {fig['goal']['text']} | {_num(value)} | {verdict} |"
            )
    out += ["", "## How the numbers are made", "", _METHOD, ""]
    for name, res in doc["results"].items():
        out += [f"## {name}", ""]
        if res.get("about"):
            out += [res["about"].strip(), ""]
        if res.get("error"):
            out += [f"**Error, nothing measured:** `{res['error']}`", ""]
        for curve, group in itertools.groupby(res["figures"], key=_curve_of):
            if curve is not None:
                out += [f"### {curve}", "", *_curve_rows(list(group))]
                continue
            for fig in group:
                out += [f"### {fig['name']}", "", fig["what"], ""]
                out += _figure_rows(fig)
        for note in res.get("notes", []):
            out.append(f"- {note}")
        out += ["", f"(took {res['duration_s']} s)", ""]
    return "\n".join(out).rstrip() + "\n"


_METHOD = """\
Every speed figure is a ratio to a baseline measured in the same run on the same
machine; nothing is compared with a number from another run. Each benchmark runs
its arms for several repetitions of N operations, interleaved (the order rotates
every repetition: AB, BA, AB, ...) so the drift of a noisy 2-core machine falls on
both arms. p50 and p99 are per operation over all repetitions pooled; the rate
(ops/s) is the median over repetitions; the ratio is the median over repetition
pairs of (subject cost / baseline cost) or (subject rate / baseline rate) as each
figure says, with the smallest and largest pair shown. Memory is the resident
high-water mark (`VmHWM` of a live process, `ru_maxrss` from `wait4` for one that
exited). The tests never assert on any of these numbers."""
