"""harness/bump/bisect.py through real pip and real venvs, without the network.

``qwen3probe`` 1.0–1.3 are built here as wheels (``pip wheel`` on a minimal pyproject) into a
find-links dir; 1.2 changes the value ``tests/cpu/bisect_probe.py`` judges with the suite's
``golden`` fixture and makes its other check flaky. The bisection installs each point over
``.venv`` in a layered venv and runs those two checks twice per point.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from harness.bump.__main__ import main
from harness.bump.bisect import EXIT_CANNOT, EXIT_NAMED, EXIT_NOT_NAMED, Point, between, from_bump
from harness.bump.layer import installed
from harness.bump.plan import LOCK, BumpError
from harness.judge.goldens import environment_metadata

VALUE_TEST = "tests/cpu/bisect_probe.py::test_probe_value"
FLAKY_TEST = "tests/cpu/bisect_probe.py::test_probe_flaky"
#: qwen3probe's value and flakiness per release: 1.2 is the one that moves both.
RELEASES = {
    "1.0": (1.548012, False),
    "1.1": (1.548012, False),
    "1.2": (1.61, True),
    "1.3": (1.61, True),
}


def test_releases_between_the_pin_and_the_candidate():
    releases = ["1.0", "1.1", "1.2", "1.10", "1.3"]
    assert between(releases, "1.0", "1.3") == ["1.1", "1.2", "1.3"]
    assert between(releases, "1.2", "1.10") == ["1.3", "1.10"]  # by version, not by string
    with pytest.raises(BumpError, match="1.0 is not after the pinned 1.2"):
        between(releases, "1.2", "1.0")
    with pytest.raises(BumpError, match="1.4 is not among the index's releases"):
        between(releases, "1.0", "1.4")


def test_a_point_is_flaky_when_its_runs_differ():
    point = Point("p", {}, {"a": ["passed", "passed"], "b": ["failed", "passed"]}, {}, 0.0)
    assert point.verdict("a") == "passed" and point.verdict("b") == "flaky (passed 1 of 2)"
    assert point.state == "flaky"
    assert (
        Point("p", {}, {"a": ["failed", "failed"], "b": ["failed", "passed"]}, {}, 0.0).state
        == "bad"
    )
    assert Point("p", {}, {"a": ["passed", "passed"]}, {}, 0.0).state == "good"


def test_a_bump_report_gives_the_candidates_and_what_broke(tmp_path):
    """make bump's report is the bisection's input: its moves (asked first) and its breaks, not its flaky ones."""
    from harness.bump.candidate import Move
    from harness.bump.comparison import Comparison, Row
    from harness.bump.plan import plan
    from harness.bump.report import write_report
    from harness.bump.tier import TierRun

    bump = plan(["transformers==5.23.0"], reports=tmp_path)
    bump.work.mkdir(parents=True)
    rows = [
        Row("t::broke", "passed", "failed", "broke"),
        Row("t::flaky", "passed", "failed", "flaky (passed 1 of 2 re-runs)"),
        Row("t::same", "passed", "passed", "same"),
    ]
    moved = [
        Move("transformers", "5.16.0", "5.23.0", True),
        Move("tokenizers", "0.22.1", "0.23.0", False),
    ]
    meta = {
        "date": "d",
        "lock_versions": "",
        "candidate_versions": "",
        **{
            label: asdict(TierRun(python="?", report_dir=label))
            for label in ("baseline", "candidate")
        },
    }
    write_report(bump, Comparison(rows, [], [], [], []), moved, meta)
    assert from_bump(bump.report_json) == (
        {"transformers": "5.23.0", "tokenizers": "0.23.0"},
        ["t::broke"],
    )
    write_report(bump, Comparison(rows[1:], [], [], [], []), moved, meta)
    with pytest.raises(BumpError, match="nothing broke in .*: nothing to bisect"):
        from_bump(bump.report_json)
    assert (
        main(["--bisect", "--from-bump", str(tmp_path / "none.json")], log=lambda line: None)
        == EXIT_CANNOT
    )


def build_wheel(
    root, wheels, name: str, version: str, code: str, requires: tuple[str, ...] = ()
) -> None:
    """``name`` ``version`` as a wheel in ``wheels``, built by real pip from a minimal pyproject."""
    src = root / "src" / f"{name}-{version}"
    (src / name.replace("-", "_")).mkdir(parents=True)
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\n'
        f"dependencies = {json.dumps(list(requires))}\n"
    )
    (src / name.replace("-", "_") / "__init__.py").write_text(code)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-index",
            "--no-build-isolation",
            "--no-deps",
            "--wheel-dir",
            str(wheels),
            str(src),
        ],
        check=True,
    )


def probe_code(version: str, value: float, flaky: bool) -> str:
    """qwen3probe's module: from 1.2 on, its new VALUE only where qwen3probe-ctx is absent or at 2.0 (NEW)."""
    code = f"__version__ = {version!r}\nFLAKY = {flaky}\n"
    if value == RELEASES["1.0"][0]:
        return code + f"VALUE = {value!r}\n"
    return code + (
        "try:\n    from qwen3probe_ctx import NEW\nexcept ImportError:\n    NEW = True\n"
        f"VALUE = {value!r} if NEW else {RELEASES['1.0'][0]!r}\n"
    )


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """A find-links dir of qwen3probe 1.0–1.3 (from 1.2 on requiring qwen3probe-ctx>=2.0) and
    qwen3probe-ctx 1.0, 2.0; locks pinning the first of each; the golden (1.0's value)."""
    root = tmp_path_factory.mktemp("bisect")
    wheels = root / "wheels"
    for version, (value, flaky) in RELEASES.items():
        requires = ("qwen3probe-ctx>=2.0",) if value != RELEASES["1.0"][0] else ()
        build_wheel(
            root, wheels, "qwen3probe", version, probe_code(version, value, flaky), requires
        )
    for version, new in (("1.0", False), ("2.0", True)):
        build_wheel(root, wheels, "qwen3probe-ctx", version, f"NEW = {new}\n")
    (root / "requirements-lock.txt").write_text(LOCK.read_text() + "qwen3probe==1.0\n")
    (root / "requirements-lock-ctx.txt").write_text(
        LOCK.read_text() + "qwen3probe==1.0\nqwen3probe-ctx==1.0\n"
    )
    goldens = root / "goldens" / "qwen3probe"
    goldens.mkdir(parents=True)
    entry = {
        "value": RELEASES["1.0"][0],
        "tolerance": 0.0,
        "lane": "exact",
        "reason": "qwen3probe 1.0's VALUE",
    }
    (goldens / "cpu.json").write_text(
        json.dumps({"metadata": environment_metadata(), "values": {"probe_value": entry}})
    )
    return root


def bisect(
    probe, monkeypatch, name, tests, pins=("qwen3probe==1.3",), lock="requirements-lock.txt"
):
    monkeypatch.setenv("QWEN3_GOLDENS_DIR", str(probe / "goldens"))
    monkeypatch.setenv("QWEN3PROBE_RUNS", str(probe / f"{name}-runs"))
    reports = probe / name
    lines = []
    code = main(
        [
            "--bisect",
            *pins,
            *(a for t in tests for a in ("--test", t)),
            "--lock",
            str(probe / lock),
            "--find-links",
            str(probe / "wheels"),
            "--venv",
            str(probe / "layer"),
            "--reports",
            str(reports),
        ],
        log=lines.append,
    )
    (found,) = [json.loads(p.read_text()) for p in reports.glob("*.json")]
    return code, found, lines


@pytest.mark.parametrize(
    "args, message",
    [
        (["qwen3probe==1.3"], "no test to bisect: make bisect PKGS="),
        (["--test", VALUE_TEST], 'nothing to bisect: make bisect PKGS="name==version ..."'),
        (
            ["nosuch==1.0", "--test", VALUE_TEST],
            "requirements-lock.txt: a bisection starts from the lock's pin",
        ),
        (["qwen3probe==0.9", "--test", VALUE_TEST], "qwen3probe 0.9 is not after the pinned 1.0"),
        (
            ["qwen3probe==1.3", "--test", VALUE_TEST],
            "`pip index versions qwen3probe --no-index --find-links ",
        ),
    ],
)
def test_bad_input_is_refused_in_one_line_before_any_point_runs(tmp_path, args, message):
    lock = tmp_path / "requirements-lock.txt"
    lock.write_text("qwen3probe==1.0\n")
    (tmp_path / "empty").mkdir()  # an index with no qwen3probe
    lines = []
    argv = [
        "--bisect",
        *args,
        "--lock",
        str(lock),
        "--find-links",
        str(tmp_path / "empty"),
        "--venv",
        str(tmp_path / "v"),
    ]
    assert main(argv, log=pytest.fail, refuse=lines.append) == EXIT_CANNOT
    assert len(lines) == 1 and lines[0].startswith("bisect: ") and message in lines[0], lines
    assert not (tmp_path / "v").exists()


@pytest.mark.slow
def test_bisection_names_the_release_that_moves_a_golden(probe, monkeypatch):
    code, found, lines = bisect(probe, monkeypatch, "value", [VALUE_TEST, FLAKY_TEST])
    assert code == EXIT_NAMED, lines
    assert (
        found["headline"]
        == "qwen3probe 1.1 → 1.2 moves qwen3probe.cpu.probe_value: 1.548012 → 1.61"
    ), lines
    assert (found["package"], found["old"], found["new"], found["broken"]) == (
        "qwen3probe",
        "1.1",
        "1.2",
        [VALUE_TEST],
    )
    # 1.2 declares qwen3probe-ctx>=2.0, which this lock lacks: installed --no-deps, that is said, not hidden
    assert found["unmet"] == ["qwen3probe 1.2 requires qwen3probe-ctx, which is not installed."]
    assert [(p["label"], p["state"]) for p in found["points"]] == [
        ("the lock", "good"),
        ("qwen3probe alone", "bad"),
        ("qwen3probe 1.1", "good"),
        ("qwen3probe 1.2", "bad"),
    ]
    # the flaky check is reported flaky at each point where it is, never counted as the break
    assert found["flaky"] == [
        f"{FLAKY_TEST}: flaky (passed 1 of 2) at qwen3probe alone",
        f"{FLAKY_TEST}: flaky (passed 1 of 2) at qwen3probe 1.2",
    ]
    assert "qwen3probe" not in installed(
        Path(sys.executable)
    )  # the layer's installs never reach .venv


@pytest.mark.slow
def test_a_flaky_break_stops_the_bisection(probe, monkeypatch):
    code, found, lines = bisect(probe, monkeypatch, "flaky", [FLAKY_TEST])
    assert code == EXIT_NOT_NAMED, lines
    assert found["package"] is None
    assert found["headline"] == (
        f"no release named: flaky at qwen3probe alone ({FLAKY_TEST}: flaky (passed 1 of 2))"
    ), lines


@pytest.mark.slow
def test_a_break_that_needs_two_packages_names_the_second_with_the_first_as_context(
    probe, monkeypatch
):
    """Neither alone breaks it: added in the order given, qwen3probe-ctx 2.0 completes the break."""
    code, found, lines = bisect(
        probe,
        monkeypatch,
        "context",
        [VALUE_TEST],
        ("qwen3probe==1.3", "qwen3probe-ctx==2.0"),
        "requirements-lock-ctx.txt",
    )
    assert code == EXIT_NAMED, lines
    assert found["headline"] == (
        "qwen3probe-ctx 1.0 → 2.0 (with qwen3probe==1.3) moves qwen3probe.cpu.probe_value: "
        "1.548012 → 1.61"
    ), lines
    assert [(p["label"], p["state"]) for p in found["points"]] == [
        ("the lock", "good"),
        ("qwen3probe alone", "good"),
        ("qwen3probe-ctx alone", "good"),
        ("qwen3probe+qwen3probe-ctx", "bad"),
    ]
    assert found["unmet"] == []  # qwen3probe 1.3's qwen3probe-ctx>=2.0 is met at the named point
