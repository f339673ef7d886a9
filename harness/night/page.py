"""``python -m harness page REPORT_DIR [--runs-log FILE]``: a report directory as one page.

A run or a night leaves its answer spread over files (results.json, tests.json, launches.json,
loss and trend PNGs, upstream reports, every rank's logs under runs/). The page sets them side by
side, in one self-contained file: images inline as data URIs, no script, no network fetch, so it
reads the same from a downloaded artifact, a static host or the disk. A rehearsal's page
(``recipes.tiers.rehearsal_mark``) says on every figure that it is never a trn2 result.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from harness.base.run_dir import CONSOLE_FILE, ERROR_FILE, LOGS_DIR, PROVENANCE_FILE, RUN_FILE
from harness.judge import goldens
from harness.launch.speed import run_label
from harness.night import plan as nightly
from harness.night import upstream
from harness.report import history
from harness.report import markdown as report_markdown
from harness.report import results as report
from recipes.tiers import rehearsal_mark

PROG = "python -m harness page"
PAGE_FILE = "index.html"
TESTS_JSON = "tests.json"
LAUNCHES_JSON = "launches.json"
TEMPLATE = "page.html.j2"
#: The judge of a claim in results.json: the main job's own verdict, not a pytest test.
MAIN_JOB_JUDGE = "python -m harness run (harness.judge.verdicts.judge)"
REFERENCE_JUDGE = "python -m harness run (harness.judge.verdicts.reference_of)"


@dataclass
class VerdictRow:
    """One judged number: a row of the verdict table."""

    name: str
    what: str
    lane: str
    published: str
    golden: str
    measured: str
    tolerance: str
    basis: str
    verdict: str
    #: "pass", "fail" or "open" (unmeasured, recorded, inputs differ): the row's colour.
    state: str
    judge: str


@dataclass
class Moved:
    """A claim that left its tolerance, with what explains it where the report has it."""

    name: str
    lines: list[str] = field(default_factory=list)
    upstream: str | None = None
    upstream_text: str = ""


@dataclass
class Figure:
    """One inline image and what it shows."""

    title: str
    src: str
    caption: str = ""


@dataclass
class Launch:
    """One launch's speed figures, and the nightly plan's estimate where the plan has it."""

    name: str
    cells: list[str]


@dataclass
class RunLinks:
    """One run directory and its logs, as paths relative to the page."""

    name: str
    href: str
    files: list[tuple[str, str]]


@dataclass
class Page:
    """Everything the template shows, already formatted as text."""

    title: str
    mark: str
    generated: str
    source: str
    interrupted: list[str]
    claims: list[VerdictRow]
    moved: list[Moved]
    curves: list[Figure]
    speed_header: list[str]
    launches: list[Launch]
    speed_notes: list[str]
    trends: list[Figure]
    trend_notes: list[str]
    inputs: list[list[str]]
    versions: dict[str, str]
    runs: list[RunLinks]
    timing: str


SPEED_HEADER = [
    "launch",
    "tier",
    "procs",
    "s/step",
    "tokens/s",
    "MFU",
    "to step 1 (s)",
    "NEFF cache",
]
PLAN_HEADER = ["estimate cold (min)", "estimate warm (min)", "measured launch (min)", "steps"]


def _fmt(value) -> str:
    """A number as results.md writes it (7 significant digits), "–" for none."""
    if value is None:
        return "–"
    return f"{value:.7g}" if isinstance(value, float) else str(value)


def read_json(path: Path) -> dict:
    """A JSON file of the report, or {} when missing or unreadable: the page shows what there is."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def data_uri(path: Path) -> str:
    """``path`` inline: the page carries its images, so it reads the same wherever it is copied."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def state_of(passed, verdict: str) -> str:
    if passed is True:
        return "pass"
    if passed is False or str(verdict).split(", ")[-1] in upstream.FAILING:
        return "fail"
    return "open"


def basis_of(recipe: str, tier: str, key: str) -> str:
    """A golden's written reason (a test's row carries only its key)."""
    try:
        return goldens.load(recipe, tier)[1][key].reason
    except (goldens.GoldenError, KeyError, OSError, ValueError):
        return "–"


def claim(
    name: str, what: str, row: dict, basis: str, verdict: str, state: str, judge: str
) -> VerdictRow:
    """A verdict-table row; ``row`` holds lane, published, golden, measured and tolerance."""
    cells = [_fmt(row.get(k)) for k in ("published", "golden", "measured", "tolerance")]
    return VerdictRow(name, what, row.get("lane") or "–", *cells, basis, verdict, state, judge)


def main_job_claims(results: dict) -> list[VerdictRow]:
    """results.json: each check of ``python -m harness run`` and each run's host reference."""
    rows = []
    for c in results.get("checks", []):
        verdict = c.get("verdict") or {True: "pass", False: "FAIL"}.get(c.get("passed"), "recorded")
        state = state_of(c.get("passed"), verdict)
        what = c.get("claim") or "–"
        rows.append(
            claim(c["key"], what, c, c.get("reason") or "–", verdict, state, MAIN_JOB_JUDGE)
        )
    for run in results.get("runs", []):
        ref = run.get("reference")
        if not ref or ref.get("error"):
            continue
        row = {**ref, "lane": "reference", "golden": ref.get("reference"), "published": None}
        verdict, state = ref.get("verdict") or "–", state_of(ref.get("passed"), "")
        what = "step-1 loss vs transformers on the same batch (host, fp32)"
        basis = ref.get("tolerance_reason") or "–"
        name = f"{run_label(run['run_dir'])}.reference"
        rows.append(claim(name, what, row, basis, verdict, state, REFERENCE_JUDGE))
    return rows


def test_claims(tests: dict) -> list[VerdictRow]:
    """tests.json: each golden a pytest session judged (the night's claims among them)."""
    rows = []
    for r in tests.get("goldens", []):
        basis, verdict = basis_of(r["recipe"], r["tier"], r["key"]), str(r.get("verdict"))
        name = f"{r['recipe']}.{r['tier']}.{r['key']}"
        test = r.get("test", "–")
        rows.append(claim(name, "–", r, basis, verdict, state_of(None, verdict), test))
    return rows


def moved_claims(
    report_dir: Path, claims: list[VerdictRow], results: dict, tests: dict
) -> list[Moved]:
    """Each failing claim: its run's diagnosis, first divergence, lanes' causes, upstream report."""
    moved = []
    for claim in (c for c in claims if c.state == "fail"):
        entry, recipe = Moved(claim.name), claim.name.split(".")[0]
        for run in results.get("runs", []):
            ref = run.get("reference") or {}
            label = run_label(run["run_dir"])
            ours = run.get("recipe") == recipe or claim.name == f"{label}.reference"
            if ours and (ref.get("diagnosis") or ref.get("localization")):
                entry.lines.append(f"{label}: diagnosis: {ref.get('diagnosis') or '–'}")
                if ref.get("localization"):
                    entry.lines.append(f"first divergence: {ref['localization']['summary']}")
        for lanes in tests.get("lanes", []):
            if lanes.get("recipe") == recipe:
                causes = lanes.get("causes", {})
                entry.lines += [f"{what}: {cause}" for what, cause in causes.items()]
        found = report_dir / "upstream" / f"{claim.name}.md"
        if found.is_file():
            entry.upstream = found.relative_to(report_dir).as_posix()
            entry.upstream_text = found.read_text()
        if not entry.lines:
            entry.lines.append("no diagnosis in this report (no host reference or localizer ran)")
        moved.append(entry)
    return moved


def speed_row(run: dict) -> list[str]:
    """A run's (or a runs-log line's) speed cells: results.md's figures, one place for each."""
    speed = run.get("speed") or {}
    step, tps = speed.get("step_time_s"), speed.get("tokens_per_s")
    cells = ["–" if step is None else f"{step:.3f}", "–" if tps is None else f"{tps:,.0f}"]
    return [
        run.get("tier", "–"),
        str(run.get("nproc", "–")),
        *cells,
        *report_markdown.speed_cells(speed),
    ]


def launches(results: dict, night: dict, records: list[dict]) -> tuple[list[str], list[Launch]]:
    """Per launch: its speed (results.json, tonight's runs-log lines); on a night, the plan too."""
    rows: dict[str, list[str]] = {}
    for run in results.get("runs", []):
        rows[run_label(run["run_dir"])] = speed_row(run)
    last = history.night_of(records[-1]) if records else None
    for record in records:
        if record.get("kind") == "run" and history.night_of(record) == last:
            rows.setdefault(record.get("label", "?"), speed_row(record))
    if not night:
        return SPEED_HEADER, [Launch(name, cells) for name, cells in rows.items()]
    plan, blank = nightly.launch_estimates(), ["–"] * (len(SPEED_HEADER) - 1)
    out = []
    for name in [*plan, *(n for n in rows if n not in plan)]:
        got, estimate = night.get(name), plan.get(name)
        planned = (
            ["–", "–"] if estimate is None else [f"{estimate.cold:.0f}", f"{estimate.warm:.0f}"]
        )
        measured = ["not launched", "–"]
        if got is not None:
            measured = [f"{got['launch_min']:.1f}", str(got.get("steps"))]
        out.append(Launch(name, [*rows.get(name, blank), *planned, *measured]))
    return SPEED_HEADER + PLAN_HEADER, out


def trends(report_dir: Path, runs_log: Path | None) -> tuple[list[Figure], list[str]]:
    """The trend PNGs across nights (``harness.report.history``): drawn from ``runs_log``, else found."""
    out = report_dir / "history"
    notes = []
    if runs_log is not None:
        try:
            history.write(runs_log, out)
        except history.HistoryError as e:
            notes.append(f"no trend: {e}")
    summary = read_json(out / history.SUMMARY)
    if not summary:
        return [], notes or [f"no trend: no runs log given ({PROG} DIR --runs-log FILE)"]
    changes = summary.get("version_changes", [])
    notes += [f"{c['night']}: {history.change_label(c)}" for c in changes]
    notes = notes or [f"{len(summary.get('nights', []))} night(s), no version changed"]
    figures = []
    for name, plot in summary.get("plots", {}).items():
        if (out / plot["file"]).is_file():
            caption = f"{plot['ylabel']}; series: {', '.join(plot['series'])}"
            figures.append(Figure(name, data_uri(out / plot["file"]), caption))
    return figures, notes


def run_dirs(report_dir: Path) -> list[Path]:
    """Every run directory under ``runs/`` (the main job's one level down, a night's two)."""
    found = {p.parent for p in (report_dir / "runs").glob("*/" + RUN_FILE)}
    found |= {p.parent for p in (report_dir / "runs").glob("*/*/" + RUN_FILE)}
    return sorted(found)


def run_links(report_dir: Path, run_dir: Path) -> RunLinks:
    """A run directory's console, error and rank logs (stdout, stderr per rank and attempt)."""
    ranks = sorted((run_dir / LOGS_DIR).glob("**/*.log"))
    links = [(f.name, f) for f in (run_dir / CONSOLE_FILE, run_dir / ERROR_FILE) if f.is_file()]
    # a rank log's label: attempt_0/1/stdout.log (torchrun's own directory name says nothing)
    links += [(f.relative_to(f.parents[2]).as_posix(), f) for f in ranks]
    files = [(label, f.relative_to(report_dir).as_posix()) for label, f in links]
    return RunLinks(run_dir.name, run_dir.relative_to(report_dir).as_posix() + "/", files)


def inputs_table(run_dirs_: list[Path]) -> list[list[str]]:
    """Each run's inputs by sha256 (provenance.json "inputs": weights, config, tokenizer, data)."""
    rows = []
    for run_dir in run_dirs_:
        inputs = read_json(run_dir / PROVENANCE_FILE).get("inputs") or {}
        for kind, files in inputs.items():
            if isinstance(files, dict):
                rows += [[run_dir.name, kind, name, str(sha)] for name, sha in files.items()]
            elif files:
                rows.append([run_dir.name, kind, "–", ", ".join(map(str, files))])
    return rows


def gather(report_dir: Path, runs_log: Path | None = None) -> Page:
    """The page of ``report_dir``: whatever of results.json, tests.json, launches.json it holds."""
    results, tests = read_json(report_dir / report.RESULTS_JSON), read_json(report_dir / TESTS_JSON)
    night = read_json(report_dir / LAUNCHES_JSON)
    marks = [rehearsal_mark().get("rehearsal"), tests.get("rehearsal")]
    marks += [r.get("rehearsal") for r in tests.get("goldens", [])]
    mark = next((m for m in marks if m), "")
    claims = main_job_claims(results) + test_claims(tests)
    records = []
    if runs_log is not None:
        try:
            records = history.of_kind(history.read_lines(runs_log), rehearsal=bool(mark))
        except history.HistoryError:
            pass  # said in the trend section, which reads the same log
    header, rows = launches(results, night, records)
    curves = [
        Figure(name, data_uri(report_dir / png), "loss per step, every run of this recipe and tier")
        for name, png in report.curve_files(results.get("runs", [])).items()
        if (report_dir / png).is_file()
    ]
    speeds = [r.get("speed") or {} for r in results.get("runs", [])]
    peaks = {(s["peak_tflops"], s["peak_source"]) for s in speeds if s.get("peak_tflops")}
    trend_figures, trend_notes = trends(report_dir, runs_log)
    dirs = run_dirs(report_dir)
    versions = {**tests.get("versions", {}), **results.get("versions", {})}
    return Page(
        title=f"qwen3-trn-repro: {report_dir.resolve().name}" + (" (rehearsal)" if mark else ""),
        mark=mark,
        generated=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        source=results.get("source") or report.SOURCE,
        interrupted=report_markdown.interrupted_lines(results.get("interrupted"))[:1],
        claims=claims,
        moved=moved_claims(report_dir, claims, results, tests),
        curves=curves,
        speed_header=header,
        launches=rows,
        speed_notes=[f"MFU against a peak of {p:g} TFLOPS per rank ({src})." for p, src in peaks],
        trends=trend_figures,
        trend_notes=trend_notes,
        inputs=inputs_table(dirs),
        versions={k: str(v) for k, v in versions.items() if v},
        runs=[run_links(report_dir, d) for d in dirs],
        timing=report_markdown.timing_line(results["timing"]) if results.get("timing") else "",
    )


def render(page: Page) -> str:
    """The template beside this module, every value escaped; a name the page lacks is an error."""
    loader = jinja2.FileSystemLoader(Path(__file__).parent)
    env = jinja2.Environment(loader=loader, autoescape=True, undefined=jinja2.StrictUndefined)
    env.trim_blocks = env.lstrip_blocks = True
    return env.get_template(TEMPLATE).render(page=page)


def write(report_dir: Path, runs_log: Path | None = None) -> Path:
    """Write ``report_dir/index.html`` (whole or not at all: a reader never opens half a page)."""
    path = report_dir / PAGE_FILE
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(render(gather(report_dir, runs_log)))
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("report_dir", type=Path, help="results.json and/or tests.json are here")
    parser.add_argument("--runs-log", type=Path, help="$QWEN3_RUNS_LOG: the trend across nights")
    args = parser.parse_args(argv)
    if not args.report_dir.is_dir():
        print(f"{PROG}: error: {args.report_dir} is not a directory", file=sys.stderr)
        return 2
    started = time.perf_counter()
    path = write(args.report_dir, args.runs_log)
    print(f"page: {path} ({path.stat().st_size:,} bytes, {time.perf_counter() - started:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
