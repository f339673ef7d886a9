"""Which package, and which release of it, moves a check: ``python -m harness.bump --bisect PKGS --test ID``.

``make bump`` says a candidate set breaks a check; this says which package does it and between
which two releases. Each point (a set of versions of the candidate packages, every other package
the lock's) is installed in one layered venv (:mod:`harness.bump.layer`: the point's packages
over ``.venv``), and only the given tests run there (:func:`harness.bump.tier.run_tier`, serially),
:data:`RUNS` times: the same outcome every time is that outcome; anything else is "flaky" and the
bisection stops there rather than guess a side.

1. **package**: the lock, then each candidate alone; if none breaks the check alone, the
   candidates added one by one in the order given: the first that breaks it names the package,
   with the ones before it as the context it needs.
   With several tests, a point is bad where any of them fails every run: the release named is
   the first that breaks one of them (bisect a test alone for a later break of another).
2. **release**: that package's releases from the index (``pip index versions --json``: PyPI, or
   ``--index-url``, or ``--find-links DIR`` with ``--no-index`` offline), those after the pinned one
   up to the candidate, bisected.

Output: ``report/bisect/<name>.md`` and ``.json``, headed by e.g. ``transformers 5.19.0 → 5.20.0
moves <recipe>.cpu.step1_loss_hf: 1.548012 → 1.61``. Exit 0 when a release is named, 1 when
none is (flaky, or the set does not break it here), 2 when the bisection could not run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness.base.environment import pins
from harness.bump.candidate import moves
from harness.bump.layer import Layer, installed
from harness.bump.plan import BASELINE_VENV, LOCK, BumpError, Pin, rel, sha256, to_stderr
from harness.bump.results import load_run
from harness.bump.tier import run_tier
from harness.night import upstream
from recipes.tiers import REPO_ROOT

#: Each point runs the tests this many times; a test whose outcomes differ is "flaky" there.
RUNS = 2
BISECT_REPORTS = (
    upstream.BISECT_REPORTS
)  # read back by every upstream report (harness/night/upstream.py)
EXIT_NAMED, EXIT_NOT_NAMED, EXIT_CANNOT = 0, 1, 2


@dataclass
class Point:
    """One set of versions of the candidate packages, its tests run :data:`RUNS` times."""

    label: str
    versions: dict[str, str]
    outcomes: dict[str, list[str]]
    values: dict[str, object]  # recipe.tier.key → measured, first run
    seconds: float

    def verdict(self, test: str) -> str:
        seen = self.outcomes[test]
        if len(set(seen)) == 1:
            return seen[0]
        return (
            f"flaky (passed {seen.count('passed')} of {len(seen)})"
            if "passed" in seen
            else " / ".join(seen)
        )

    @property
    def state(self) -> str:
        """bad: a test failed every run; flaky: none did, one passed only sometimes; good: all passed."""
        verdicts = [self.verdict(t) for t in self.outcomes]
        if "failed" in verdicts:
            return "bad"
        if any(v.startswith("flaky") for v in verdicts):
            return "flaky"
        return "good" if all(v == "passed" for v in verdicts) else "unclear"


@dataclass
class Finding:
    tests: list[str]
    package: str | None = None
    old: str | None = None
    new: str | None = None
    context: dict[str, str] = field(default_factory=dict)
    moved: list[tuple[str, object, object]] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)
    flaky: list[str] = field(default_factory=list)
    unmet: list[str] = field(
        default_factory=list
    )  # pip check at the named release: what --no-deps left unmet
    stopped: str = ""
    points: list[dict] = field(default_factory=list)

    def headline(self) -> str:
        if not self.package or not self.new:
            return f"no release named: {self.stopped}"
        what = "; ".join(
            f"{k}: {short(a)} → {short(b)}" for k, a, b in self.moved
        ) or "breaks " + ", ".join(self.broken)
        verb = "moves " if self.moved else ""
        context = (
            f" (with {' '.join(f'{n}=={v}' for n, v in self.context.items())})"
            if self.context
            else ""
        )
        return f"{self.package} {self.old} → {self.new}{context} {verb}{what}"


def short(value) -> str:
    if isinstance(value, float):
        return f"{value:.7g}"
    if isinstance(value, list) and len(value) > 4:
        return f"[{', '.join(short(v) for v in value[:3])}, … ({len(value)} steps)]"
    return json.dumps(value) if not isinstance(value, str) else value


def release_list(
    name: str, base: Path, index_args: tuple[str, ...], pre: bool = False
) -> list[str]:
    """Every release of ``name`` the index offers (``pip index versions --json``), oldest first."""
    command = [
        str(base),
        "-m",
        "pip",
        "index",
        "versions",
        name,
        "--json",
        "--disable-pip-version-check",
        *index_args,
    ]
    out = subprocess.run(command + (["--pre"] if pre else []), capture_output=True, text=True)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        raise BumpError(
            f"`pip index versions {' '.join([name, *index_args])}` found no releases: {last}"
        )
    return sorted(json.loads(out.stdout)["versions"], key=Version)


def between(releases: list[str], old: str, new: str) -> list[str]:
    """The releases after ``old`` up to and including ``new`` (which must be one of them)."""
    if Version(new) <= Version(old):
        raise BumpError(
            f"{new} is not after the pinned {old}: the bisection goes from the lock's release to a later one"
        )
    if new not in releases:
        latest = ", ".join(sorted(releases, key=Version)[-5:])
        raise BumpError(
            f"{new} is not among the index's releases (latest: {latest}): check the pin, --find-links or --index-url"
        )
    return sorted((r for r in releases if Version(old) < Version(r) <= Version(new)), key=Version)


def from_bump(path: Path) -> tuple[dict[str, str], list[str]]:
    """A ``make bump`` report's moved packages (asked first) and the tests that broke there (after its re-runs)."""
    if not path.is_file():
        raise BumpError(
            f"{rel(path)} does not exist: make bump PKGS=... writes report/bump/<name>.json"
        )
    data = json.loads(path.read_text())
    if "moved" not in data:
        raise BumpError(
            f"{rel(path)} is not a rehearsed bump's report (no 'moved'): {data.get('not_rehearsed', '?')}"
        )
    tests = [row["test"] for row in data["tests"] if row["change"] == "broke"]
    if not tests:
        raise BumpError(
            f"nothing broke in {rel(path)} (flaky and expected ones are not breaks): nothing to bisect"
        )
    return {m["name"]: m["new"] for m in data["moved"] if m["new"]}, tests


class Runner:
    """Installs a point into the layer and runs the tests there :data:`RUNS` times; each point once."""

    def __init__(self, layer: Layer, tests: list[str], work: Path, lock: Path, log=print):
        self.layer, self.tests, self.work, self.lock, self.log = layer, tests, work, lock, log
        self.base = installed(layer.base)
        self.points: dict[tuple, Point] = {}

    def layered(self, versions: dict[str, str]) -> dict[str, str]:
        """What the layer installs for a point: its versions that ``.venv`` does not already have."""
        return {n: v for n, v in versions.items() if self.base.get(n) != v}

    def run(self, label: str, versions: dict[str, str]) -> Point:
        key = tuple(sorted(versions.items()))
        if key in self.points:
            return self.points[key]
        self.log(f"point {label}: {' '.join(f'{n}=={v}' for n, v in versions.items())}")
        start = time.monotonic()
        self.layer.apply(self.layered(versions))
        outcomes: dict[str, list[str]] = {t: [] for t in self.tests}
        values: dict[str, object] = {}
        slug = "-".join(f"{n}-{v}" for n, v in key)
        for i in range(1, RUNS + 1):
            report_dir = self.work / f"{slug}-run-{i}"
            run_tier(self.layer.python, report_dir, self.lock, self.log, tests=tuple(self.tests))
            results, goldens, _ = load_run(report_dir)
            for test in self.tests:
                outcomes[test].append(results[test].outcome if test in results else "absent")
            if i == 1:
                values = {
                    f"{g['recipe']}.{g['tier']}.{g['key']}": g.get("measured")
                    for g in goldens
                    if g["test"] in self.tests
                }
        point = Point(label, dict(versions), outcomes, values, round(time.monotonic() - start, 1))
        verdicts = ", ".join(f"{t.split('::')[-1]} {point.verdict(t)}" for t in self.tests)
        self.log(f"  {point.state} in {point.seconds:.0f} s: {verdicts}")
        self.points[key] = point
        return point


def releases_to_bisect(
    locked: dict[str, str], candidates: dict[str, str], base: Path, index_args: tuple[str, ...]
) -> dict[str, list[str]]:
    """Each candidate's releases after its pin up to the candidate, checked before any point runs."""
    for name, new in candidates.items():
        if Version(new) <= Version(locked[name]):
            raise BumpError(
                f"{name} {new} is not after the pinned {locked[name]}: the bisection goes from the lock's "
                f"release to a later one"
            )
    return {
        name: between(
            release_list(name, base, index_args, Version(new).is_prerelease), locked[name], new
        )
        for name, new in candidates.items()
    }


def bisect(
    runner: Runner,
    locked: dict[str, str],
    candidates: dict[str, str],
    releases_of: dict[str, list[str]],
) -> Finding:
    """Step 1 (package) then step 2 (release); stops, saying why, at a flaky or unclear point."""
    finding = Finding(tests=list(runner.tests))

    def stop(point: Point, why: str) -> Finding:
        finding.stopped = f"{why} at {point.label} ({', '.join(f'{t}: {point.verdict(t)}' for t in runner.tests)})"
        return finding

    good = runner.run("the lock", locked)
    if good.state != "good":
        return stop(good, "the tests do not pass on the lock")
    culprit, bad = None, None
    for name in candidates:
        point = runner.run(f"{name} alone", {**locked, name: candidates[name]})
        if point.state in ("flaky", "unclear"):
            return stop(point, point.state)
        if point.state == "bad":
            culprit, bad = name, point
            break
    if culprit is None:
        applied: dict[str, str] = {}
        for name in candidates:
            before = runner.run("+".join(applied) or "the lock", {**locked, **applied})
            applied[name] = candidates[name]
            point = runner.run("+".join(applied), {**locked, **applied})
            if point.state in ("flaky", "unclear"):
                return stop(point, point.state)
            if point.state == "bad":
                culprit, bad, good = name, point, before
                finding.context = {n: v for n, v in applied.items() if n != name}
                break
    if culprit is None:
        finding.stopped = (
            "the candidate set does not break them here (with every package the bump's resolver moved? "
            "--from-bump or --candidate-lock adds them)"
        )
        return finding
    base = {**locked, **finding.context}
    releases = releases_of[culprit]
    lo, hi = -1, len(releases) - 1  # releases[hi] is bad; releases[lo] (the pinned one at -1) good
    while hi - lo > 1:
        mid = (lo + hi) // 2
        point = runner.run(f"{culprit} {releases[mid]}", {**base, culprit: releases[mid]})
        if point.state in ("flaky", "unclear"):
            return stop(point, point.state)
        if point.state == "bad":
            hi, bad = mid, point
        else:
            lo, good = mid, point
    finding.package, finding.new = culprit, releases[hi]
    finding.old = releases[lo] if lo >= 0 else locked[culprit]
    finding.broken = [t for t in runner.tests if bad.verdict(t) == "failed"]
    finding.moved = [
        (k, good.values.get(k), v) for k, v in sorted(bad.values.items()) if good.values.get(k) != v
    ]
    runner.layer.apply(runner.layered(bad.versions))
    finding.unmet = runner.layer.unmet()
    return finding


def conclude(finding: Finding, runner: Runner) -> Finding:
    """The finding with every point run and every flaky verdict seen on the way."""
    for point in runner.points.values():
        finding.points.append(
            {
                "label": point.label,
                "versions": point.versions,
                "state": point.state,
                "verdicts": {t: point.verdict(t) for t in runner.tests},
                "seconds": point.seconds,
            }
        )
        finding.flaky += [
            f"{t}: {point.verdict(t)} at {point.label}"
            for t in runner.tests
            if point.verdict(t).startswith("flaky")
        ]
    return finding


def markdown(finding: Finding) -> str:
    lines = [
        f"# Bisection: {finding.headline()}",
        "",
        f"Tests: {', '.join(f'`{t}`' for t in finding.tests)}",
        "",
    ]
    lines += [f"- flaky: `{f}`" for f in finding.flaky] + ([""] if finding.flaky else [])
    lines += [
        f"- unmet at {finding.package} {finding.new} (installed --no-deps over the lock): {u}"
        for u in finding.unmet
    ]
    lines += [""] if finding.unmet else []
    lines += [
        f"Each point run {RUNS} times in one layered venv.",
        "",
        "| point | versions | state | verdicts | s |",
        "|---|---|---|---|---|",
    ]
    for p in finding.points:
        versions = " ".join(f"{n}=={v}" for n, v in p["versions"].items())
        verdicts = "; ".join(f"{t.split('::')[-1]}: {v}" for t, v in p["verdicts"].items())
        lines.append(
            f"| {p['label']} | {versions} | {p['state']} | {verdicts} | {p['seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m harness.bump --bisect", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "pins", nargs="*", help="the candidate set, name==version (make bump's PKGS)"
    )
    parser.add_argument(
        "--test", action="append", default=[], help="a test node id that breaks (repeatable)"
    )
    parser.add_argument(
        "--from-bump", type=Path, help="a make bump report (.json): its moves and what broke"
    )
    parser.add_argument(
        "--candidate-lock", type=Path, help="also every package a bump's candidate lock moved"
    )
    parser.add_argument("--lock", type=Path, default=LOCK)
    parser.add_argument(
        "--find-links", help="a directory of wheels: the only index (pip --no-index --find-links)"
    )
    parser.add_argument("--index-url", help="a PEP 503 index instead of pip's configured one")
    parser.add_argument("--base-python", type=Path, default=BASELINE_VENV / "bin" / "python")
    parser.add_argument("--venv", type=Path, help="the layered venv (default .venv-bisect-<hash>)")
    parser.add_argument("--reports", type=Path, default=BISECT_REPORTS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, log=print, refuse=to_stderr) -> int:
    args = parse_args(argv)
    try:
        asked = {p.name: p.version for p in map(Pin.parse, args.pins)}
        if args.from_bump:
            moved, broke = from_bump(args.from_bump)
            asked, args.test = asked or moved, args.test or broke
        if not args.test:
            raise BumpError(
                'no test to bisect: make bisect PKGS="name==version ..." TEST="tests/cpu/test_x.py::test_y"'
            )
        locked = pins(args.lock)
        if args.candidate_lock:
            asked |= {
                m.name: m.new
                for m in moves(locked, pins(args.candidate_lock))
                if m.new and m.name not in asked
            }
        missing = [n for n in asked if n not in locked]
        if not asked:
            raise BumpError(
                'nothing to bisect: make bisect PKGS="name==version ..." or BISECT_ARGS="--from-bump <report>"'
            )
        if missing:
            raise BumpError(
                f"{', '.join(missing)} not in {rel(args.lock)}: a bisection starts from the lock's pin"
            )
        for version in asked.values():
            Version(version)
    except (BumpError, InvalidVersion) as e:
        refuse(f"bisect: {e}")
        return EXIT_CANNOT
    index_args = ("--no-index", "--find-links", args.find_links) if args.find_links else ()
    index_args += ("--index-url", args.index_url) if args.index_url else ()
    name = "+".join(f"{n}-{v}" for n, v in sorted(asked.items()))
    digest = hashlib.sha256(f"{sha256(args.lock)}\n{name}".encode()).hexdigest()[:12]
    layer = Layer(args.venv or REPO_ROOT / f".venv-bisect-{digest}", args.base_python, index_args)
    try:
        releases_of = releases_to_bisect(
            {n: locked[n] for n in asked}, asked, args.base_python, index_args
        )
        runner = Runner(layer, args.test, args.reports / name, args.lock, log)
        finding = conclude(
            bisect(runner, {n: locked[n] for n in asked}, asked, releases_of), runner
        )
    except BumpError as e:
        refuse(f"bisect: {e}")
        return EXIT_CANNOT
    args.reports.mkdir(parents=True, exist_ok=True)
    (args.reports / f"{name}.md").write_text(markdown(finding))
    (args.reports / f"{name}.json").write_text(
        json.dumps({"headline": finding.headline(), **asdict(finding)}, indent=2) + "\n"
    )
    log(finding.headline())
    for line in finding.flaky:
        log(f"  flaky: {line}")
    for line in finding.unmet:
        log(f"  unmet there (installed --no-deps over the lock): {line}")
    log(f"bisect report: {rel(args.reports / name)}.md, .json")
    return EXIT_NAMED if finding.package else EXIT_NOT_NAMED
