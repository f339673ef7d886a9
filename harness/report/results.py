"""The report every run writes: results.json, a markdown table, and the versions behind them."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from filelock import FileLock

from harness.base import marker
from harness.base.environment import cpu_fingerprint, cpu_model, torchtitan_neuron, versions  # noqa: F401 -- in every report
from harness.declare.published import CLAIMS, SOURCE
from harness.report.markdown import markdown

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
#: A test's verdict on a claim is its report property ``<claim key>.verdict`` (tests.json, JUnit XML).
VERDICT_SUFFIX = ".verdict"


def load(report_dir: Path) -> dict:
    """The report so far; one that cannot be read (cut short, edited by hand) is kept aside, never lost, and
    the report starts again, saying so on stderr."""
    path = report_dir / RESULTS_JSON
    empty = {"source": SOURCE, "runs": [], "checks": []}
    if not path.exists():
        return empty
    try:
        report = json.loads(path.read_text())
        lists = isinstance(report, dict) and all(
            isinstance(report.get(k, []), list) for k in ("runs", "checks")
        )
        if lists:
            _keep_a_copy_if_foreign(path)
            return {**empty, **report}
        why = "not a report object"
    except (ValueError, OSError) as e:
        why = f"{type(e).__name__}: {e}"
    kept = next(
        path.with_name(f"{RESULTS_JSON}.unreadable-{n}")
        for n in range(1, 10_000)
        if not path.with_name(f"{RESULTS_JSON}.unreadable-{n}").exists()
    )
    path.rename(kept)
    print(
        f"harness.report.results: {path} could not be read ({why}); kept as {kept.name}, starting a new report",
        file=sys.stderr,
    )
    return empty


def _keep_a_copy_if_foreign(path: Path) -> None:
    """A results.json the suite did not write (no sha256 of it in the directory's marker) is read and its runs
    merged into the report, as before; the file itself is copied aside unchanged first, and said."""
    recorded = (marker.read(path.parent) or {}).get("files", {})
    if recorded.get(path.name) == marker.digest(path):
        return
    aside = next(
        path.with_name(f"{path.name}.foreign-{n}")
        for n in range(1, 10_000)
        if not path.with_name(f"{path.name}.foreign-{n}").exists()
    )
    shutil.copy2(path, aside)
    print(
        f"harness.report.results: {path} was not written by the suite (no sha256 of it in "
        f"{path.parent / marker.MARKER}); its runs are merged into this report, the file kept as {aside.name}",
        file=sys.stderr,
    )


def save(report_dir: Path, report: dict, replot: bool = True) -> Path:
    """Write results.json, the loss plots (unless ``replot`` is False: no run changed) and results.md."""
    report_dir.mkdir(parents=True, exist_ok=True)
    replotted = list(curve_files(report["runs"]).values()) if replot else []
    marker.keep_foreign(report_dir, [RESULTS_MD, *replotted], "harness.report.results")
    report["versions"] = versions()
    path = report_dir / RESULTS_JSON
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    report["loss_curves"] = (
        plot_loss_curves(report_dir, report["runs"]) if replot else curve_files(report["runs"])
    )
    (report_dir / RESULTS_MD).write_text(markdown(report))
    marker.record(report_dir, marker.REPORT, [RESULTS_JSON, RESULTS_MD, *replotted])
    return path


def curve_groups(runs: list[dict]) -> dict[str, list[dict]]:
    """The runs of each loss plot (one per recipe and tier), by plot name."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        if run.get("losses"):
            groups.setdefault(f"{run['recipe']}-{run['tier']}", []).append(run)
    return dict(sorted(groups.items()))


def curve_file(name: str) -> str:
    """The file name of the loss plot ``name``."""
    return f"loss-{name}.png"


def curve_files(runs: list[dict]) -> dict[str, str]:
    """Each loss plot's file name, by plot name."""
    return {name: curve_file(name) for name in curve_groups(runs)}


def import_plotting():
    """matplotlib with its file-only backend (Agg): ``pyplot``."""
    import matplotlib  # noqa: PLC0415 -- heavy: matplotlib.pyplot 1.0 s; this module stays light

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 -- heavy: matplotlib.pyplot 1.0 s; this module stays light

    return plt


def plot_loss_curves(report_dir: Path, runs: list[dict]) -> dict[str, str]:
    """One PNG per recipe and tier: every run's loss per step (pretrained vs random init)."""
    plt = import_plotting()
    written = {}
    for name, group in curve_groups(runs).items():
        fig, ax = plt.subplots(figsize=(6, 4))
        for run in group:
            width = f", {run.get('provenance', {}).get('model', {}).get('hidden_size', '?')}-wide"
            ax.plot(
                [s["step"] for s in run["steps"]],
                run["losses"],
                marker="o",
                label=f"init={run['init']}, {run['nproc']} proc{width}",
            )
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_title(name)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = report_dir / curve_file(name)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written[name] = path.name
    return written


LOCK_FILE = ".results.lock"


#: ``update``'s default for ``interrupted``: the report's mark stays as it is.
KEEP = object()


def update(
    report_dir: Path,
    runs: list[dict] = (),
    checks: list[tuple[str, object]] = (),
    timing: dict | None = None,
    interrupted: dict | None | object = KEEP,
) -> dict:
    """Add ``runs`` and ``checks`` (key, ``verdicts.Verdict``) to the report in ``report_dir``; return it.

    ``interrupted``: how the last command was stopped (signal, stage, the runs it never started), or
    None once a command ran to its end; ``timing`` is that command's too.

    Read, extend and rewrite happen under one file lock (filelock), so several
    ``python -m harness run`` into one report directory keep every run: each adds
    to what the others wrote instead of overwriting it with its own older copy.
    """

    report_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(report_dir / LOCK_FILE):
        report = load(report_dir)
        for run in runs:
            add_run(report, run)
        for key, verdict in checks:
            add_check(report, key, verdict)
        if timing is not None:
            report["timing"] = timing
        if interrupted is None:
            report.pop("interrupted", None)
        elif interrupted is not KEEP:
            report["interrupted"] = interrupted
        save(report_dir, report, replot=bool(runs))
    return report


def add_run(report: dict, run: dict) -> None:
    report["runs"].append({**run, "versions": versions()})


def add_check(report: dict, key: str, verdict) -> None:
    """One measured number against its golden (a ``verdicts.Verdict``), in its lane.

    The ``published`` field only ever holds a tutorial number (lanes published and
    proxy); an exact-lane golden is this lock's own value and goes in ``golden``.
    """
    g = verdict.golden
    claim = CLAIMS[g.claim] if g.claim else None
    report["checks"] = [c for c in report["checks"] if c["key"] != key]
    report["checks"].append(
        {
            "key": key,
            "lane": g.lane,
            "claim": claim.what if claim else None,
            "measured": verdict.measured,
            "published": claim.value if claim else None,
            "golden": None if claim else g.value,
            "tolerance": g.tolerance,
            "passed": verdict.passed,
            "verdict": verdict.kind,
            "reason": g.reason,
        }
    )
