"""``python -m harness history FILE [--out DIR]``: every published number and speed figure across nights.

FILE is JSON lines of any of three kinds, mixed or not:

* run records (``"kind": "run"``), one per launch, appended by ``harness.launch.speed`` to
  ``$QWEN3_RUNS_LOG``: step-1 loss (the published number the run's init measures) and
  the run's speed figures;
* nightly trend lines (``python -m harness.night.ci trend``): every golden a night judged;
  its published-lane values are plotted;
* benchmark lines (``benchmarks/history.jsonl``): each goal's measured value.

One PNG per figure, a line per series (a run's name, a golden's recipe and tier), one
point per night (the night's last value), and a dotted vertical line on the night any
version changed, labelled with what changed. ``plots.json`` beside the PNGs holds the
same series and markers as numbers.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from harness.base.readable import Unreadable, text_of
from harness.launch.speed import NEFF_STATES, SPEED_FIGURES
from harness.report.results import import_plotting
from recipes.tiers import rehearsal_mark

SUMMARY = "plots.json"
DEFAULT_OUT = Path("report") / "history"


class HistoryError(ValueError):
    """A history file that cannot be read; the message names the file, the line and the fix."""


@dataclass
class Plot:
    """One figure: series name -> {night: value}, and the published or target value it is held to."""

    name: str
    ylabel: str
    series: dict[str, dict[str, float]] = field(default_factory=dict)
    reference: float | None = None
    reference_label: str = ""

    def add(self, series: str, night: str, value) -> None:
        if isinstance(value, bool):
            value = float(value)
        if isinstance(value, (int, float)):
            self.series.setdefault(series, {})[night] = float(value)


def read_lines(path: Path) -> list[dict]:
    """The records of ``path``, in file order (blank lines skipped)."""
    try:
        text = text_of(
            path,
            "a runs log",
            "pass a runs log ($QWEN3_RUNS_LOG), a nightly trend file or benchmarks/history.jsonl",
        )
    except Unreadable as e:
        raise HistoryError(str(e)) from None
    records = []
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines) and not text.endswith(
                "\n"
            ):  # the last append was cut short (a killed run)
                print(
                    f"{path} line {number}: a record cut short (no newline, not JSON); left out",
                    file=sys.stderr,
                )
                continue
            raise HistoryError(
                f"{path} line {number}: not JSON ({e.msg}); each line must be one JSON object"
            ) from None
        if not isinstance(record, dict) or "date" not in record:
            raise HistoryError(
                f'{path} line {number}: a record needs a "date" key; got {line[:80]!r}'
            )
        records.append(record)
    if not records:
        raise HistoryError(
            f"{path}: no records; a run appends one when $QWEN3_RUNS_LOG names this file"
        )
    return records


def of_kind(records: list[dict], rehearsal: bool) -> list[dict]:
    """A rehearsal's lines (marked ``rehearsal``) never join a real night's history; a rehearsal draws its own only."""
    return [r for r in records if bool(r.get("rehearsal")) == rehearsal]


def night_of(record: dict) -> str:
    """A run record's night; any other line (a benchmark run, a nightly trend line) is its own point in time."""
    return str(record.get("night") or record["date"])


def _target(text: str) -> float | None:
    """The number in a goal's target text ("harness-run / bare-torchrun wall ≤ 1.1" -> 1.1)."""
    match = re.search(r"[≤<]=?\s*([0-9.]+(?:e[-+]?\d+)?)", str(text))
    return float(match.group(1)) if match else None


def collect(records: list[dict]) -> dict[str, Plot]:
    """Every plotted figure of ``records``, by plot name."""
    plots: dict[str, Plot] = {}

    def plot(name: str, ylabel: str) -> Plot:
        return plots.setdefault(name, Plot(name, ylabel))

    for record in records:
        night = night_of(record)
        if record.get("kind") == "run":
            series = f"{record.get('tier')}:{record.get('label')}"
            loss = plot(f"step1_loss-{record.get('tier')}", "step-1 loss")
            loss.add(series, night, record.get("step1_loss"))
            published = record.get("published")
            if (
                published
                and record.get("tier") != "cpu"
                and isinstance(published.get("value"), (int, float))
            ):
                loss.reference, loss.reference_label = (
                    published["value"],
                    f"published {published['value']}",
                )
            speed = record.get("speed") or {}
            for figure, ylabel in SPEED_FIGURES.items():
                plot(f"speed-{figure}", ylabel).add(series, night, speed.get(figure))
            plot("speed-neff_cache", "NEFF cache (1 warm, 0.5 partial, 0 cold)").add(
                series, night, NEFF_STATES.get(speed.get("neff_cache"))
            )
        for goal in record.get("goals") or []:
            name = f"bench-{goal.get('benchmark')}-{goal.get('name')}"
            target = plot(name, str(goal.get("target")))
            target.add(record.get("tier") or "measured", night, goal.get("measured"))
            target.reference = _target(goal.get("target"))
            target.reference_label = (
                f"target {target.reference:g}" if target.reference is not None else ""
            )
        for row in record.get("goldens") or []:
            if row.get("lane") != "published":
                continue
            value, published = row.get("measured"), row.get("published")
            figure = plot(f"published-{row.get('key')}", str(row.get("key")))
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                figure.add(f"{row.get('recipe')}.{row.get('tier')}", night, value)
                if isinstance(published, (int, float)):
                    figure.reference, figure.reference_label = published, f"published {published}"
            else:  # a list (missing keys): plotted as whether it equals the published one
                figure.ylabel = f"{row.get('key')} equals published (1 yes, 0 no)"
                figure.add(f"{row.get('recipe')}.{row.get('tier')}", night, value == published)
    return {name: p for name, p in plots.items() if p.series}


def nights(records: list[dict]) -> list[str]:
    """Every night in order of first appearance (an appended file's order)."""
    return list(dict.fromkeys(night_of(r) for r in records))


def version_changes(records: list[dict]) -> list[dict]:
    """Each night whose versions differ from the previous night's: {"night", "index", "changes": {name: [old, new]}}."""
    by_night: dict[str, dict] = {}
    for record in records:
        if isinstance(record.get("versions"), dict):
            by_night.setdefault(night_of(record), {}).update(record["versions"])
    changes, previous = [], None
    for index, night in enumerate(nights(records)):
        current = by_night.get(night)
        if current is None:
            continue
        if previous is not None:
            moved = {
                k: [previous.get(k), current.get(k)]
                for k in sorted(set(previous) | set(current))
                if previous.get(k) != current.get(k)
            }
            if moved:
                changes.append({"night": night, "index": index, "changes": moved})
        previous = current
    return changes


def file_name(plot_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", plot_name) + ".png"


def change_label(change: dict) -> str:
    return ", ".join(f"{k} {old}→{new}" for k, (old, new) in change["changes"].items())


def draw(plot: Plot, all_nights: list[str], changes: list[dict], out: Path) -> Path:
    """One PNG: a line per series over the nights, the reference, and each version change."""

    plt = import_plotting()
    index = {night: i for i, night in enumerate(all_nights)}
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for series, values in sorted(plot.series.items()):
        xs = sorted(values, key=index.get)
        ax.plot([index[x] for x in xs], [values[x] for x in xs], marker="o", label=series)
    if plot.reference is not None:
        ax.axhline(
            plot.reference, color="black", linestyle="--", linewidth=1, label=plot.reference_label
        )
    for change in changes:
        ax.axvline(change["index"], color="tab:red", linestyle=":", linewidth=1.5)
        ax.annotate(
            change_label(change),
            (change["index"], 1.0),
            xycoords=("data", "axes fraction"),
            rotation=90,
            fontsize=7,
            color="tab:red",
            ha="right",
            va="top",
            bbox={"facecolor": "white", "alpha": 0.7, "edgecolor": "none"},
        )
    ax.set_xticks(range(len(all_nights)), all_nights, rotation=45, ha="right", fontsize=7)
    ax.set_xlim(-0.5, len(all_nights) - 0.5)
    ax.set_ylabel(plot.ylabel, fontsize=8)
    ax.set_title(plot.name)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / file_name(plot.name)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write(history: Path, out: Path) -> dict:
    """Draw every plot of ``history`` into ``out``; return (and write) the plots.json summary."""
    records = of_kind(read_lines(history), rehearsal=bool(rehearsal_mark()))
    if not records:
        raise HistoryError(
            f"{history}: every line is {'a real night' if rehearsal_mark() else 'a rehearsal'}'s; "
            "a rehearsal and a real night never share a history"
        )
    all_nights, changes = nights(records), version_changes(records)
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "history": str(history),
        "nights": all_nights,
        "version_changes": changes,
        "plots": {},
    }
    for name, plot in sorted(collect(records).items()):
        path = draw(plot, all_nights, changes, out)
        summary["plots"][name] = {
            "file": path.name,
            "ylabel": plot.ylabel,
            "reference": plot.reference,
            "series": {
                s: {n: v[n] for n in all_nights if n in v} for s, v in sorted(plot.series.items())
            },
        }
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness history", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "file",
        type=Path,
        help="a runs log ($QWEN3_RUNS_LOG), a nightly trend file or benchmarks/history.jsonl",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"directory for the PNGs and {SUMMARY} (default {DEFAULT_OUT})",
    )
    args = parser.parse_args(argv)
    try:
        summary = write(args.file, args.out)
    except HistoryError as e:
        print(f"python -m harness history: error: {e}", file=sys.stderr)
        return 2
    print(
        f"{len(summary['nights'])} night(s), {len(summary['plots'])} plot(s), "
        f"{len(summary['version_changes'])} version change(s) -> {args.out}"
    )
    for change in summary["version_changes"]:
        print(f"  {change['night']}: {change_label(change)}")
    for name, plot in summary["plots"].items():
        print(f"  {plot['file']}: {', '.join(plot['series'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
