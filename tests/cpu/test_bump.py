"""harness/bump/: the plan, the resolution bookkeeping and the bump report, without building a venv.

The rehearsal itself (a venv of several GB and two cpu-tier runs) is run by hand
(``make bump PKGS=...``) and recorded in the README; here the plan is a bump that
changes nothing (the lock's own pins: no resolution, no download), and the report
is built from recorded, synthetic runs.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from harness.base.environment import pins
from harness.bump.__main__ import main
from harness.bump.candidate import (
    Move,
    cap_refusals,
    discarded,
    moves,
    pinned_requirements_in,
    read_caps,
    resolve,
)
from harness.bump.comparison import LOCK_COUPLED_TESTS, LOCK_DRIFT_TEST, compare, difference
from harness.bump.plan import (
    EXIT_CANNOT_REHEARSE,
    EXIT_OK,
    EXIT_PUBLISHED_BROKEN,
    LOCK,
    VENV_PREFIX,
    BumpError,
    Pin,
    plan,
    sha256,
)
from harness.bump.report import _golden_cell
from harness.bump.results import Result, first_line, junit_key, load_run
from harness.bump.tier import TierRun, baseline_is_current, code_sha256, tier_env
from recipes.tiers import REPO_ROOT
from recipes.upstream_shape import shape_message

NO_CHANGE = [f"transformers=={pins(LOCK)['transformers']}"]


# --- the plan -------------------------------------------------------------------------------------


def test_a_bump_to_the_locked_pins_plans_no_resolution(tmp_path):
    first = plan(NO_CHANGE, reports=tmp_path)
    assert first.unchanged()
    assert first == plan(NO_CHANGE, reports=tmp_path)  # same pins, same venv: a rerun reuses it
    assert first.venv.parent == REPO_ROOT and first.venv.name.startswith(VENV_PREFIX)
    assert first.report_md == tmp_path / f"{first.name}.md" and first.work == tmp_path / first.name
    resolve(first)  # no pip-compile: the candidate lock is the lock
    assert first.candidate_lock.read_bytes() == LOCK.read_bytes()
    assert moves(pins(LOCK), pins(first.candidate_lock), first.pins) == []


def test_another_pin_gets_another_venv(tmp_path):
    a = plan(["transformers==5.23.0"], reports=tmp_path)
    b = plan(["transformers==5.23.0", "torch==2.15.0"], reports=tmp_path)
    assert not a.unchanged() and a.venv != b.venv
    assert (
        b.name == "torch-2.15.0+transformers-5.23.0"
    )  # sorted, so the order asked in does not matter
    assert b == plan(["torch==2.15.0", "transformers==5.23.0"], reports=tmp_path)


def test_dry_run_prints_the_plan_and_creates_nothing(tmp_path, capsys):
    assert main(["--dry-run", "--reports", str(tmp_path), *NO_CHANGE]) == EXIT_OK
    out = capsys.readouterr().out
    assert "candidate venv  .venv-bump-" in out and "(= the lock: nothing to resolve)" in out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "specs, message",
    [
        ([], "nothing to bump"),
        (["transformers>=5.23"], "is not an exact pin"),
        (["transformers"], "is not an exact pin"),
        (
            ["transformers==five"],
            "is not an exact pin",
        ),  # not a version: refused here, not by pip-compile later
        (
            ["transformers[torch]==5.23.0"],
            "is not an exact pin",
        ),  # extras: the lock pins the package, not them
        (["no-such-package==1.0"], "no-such-package not in requirements-lock.txt"),
        (["transformers==5.23.0", "Transformers==5.22.0"], "transformers asked for twice"),
    ],
)
def test_bad_pins_are_refused_in_one_line(specs, message, capsys):
    with pytest.raises(BumpError, match=message):
        plan(specs)
    assert main(["--dry-run", *specs]) == EXIT_CANNOT_REHEARSE
    out = capsys.readouterr()
    assert message in out.err and message not in out.out, "a refusal goes to stderr"


def test_requirements_in_gets_the_bumped_pins():
    text = "torch==2.14.0   # the tutorial's pin\ntransformers==5.16.0\n# transformers in a comment\nsafetensors\n"
    out = pinned_requirements_in(
        text, (Pin("transformers", "5.23.0"), Pin("huggingface-hub", "1.40.0"))
    )
    assert out.splitlines() == [
        "torch==2.14.0   # the tutorial's pin",
        "transformers==5.23.0  # (bump rehearsal)",
        "# transformers in a comment",
        "safetensors",
        "huggingface-hub==1.40.0  # bump rehearsal: pinned by the bump",
    ]


def test_a_pip_cap_refuses_the_pin_by_name(tmp_path):
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("# the releases on this disk\ntorch<=2.14.1\ntorchvision<=0.29.1\n")
    caps = read_caps([constraints])
    assert cap_refusals((Pin("torch", "2.14.0"), Pin("transformers", "5.23.0")), caps) == []
    (refusal,) = cap_refusals((Pin("torch", "2.15.0"),), caps)
    assert refusal.startswith(
        f"torch==2.15.0 is refused by this machine's pip constraint torch<=2.14.1 ({constraints})"
    )


def test_what_moved_and_what_the_resolver_released():
    old = {"torch": "2.14.0", "triton": "3.8.0", "nvidia-curand": "10.4.0.35", "numpy": "2.4.6"}
    new = {"torch": "2.15.0", "triton": "3.9.0", "nvidia-cuda-cccl": "13.3.5.0.6", "numpy": "2.4.6"}
    moved = moves(old, new, (Pin("torch", "2.15.0"),))
    assert [m.line() for m in moved] == [
        "torch 2.14.0 → 2.15.0 (asked)",
        "nvidia-cuda-cccl (none) → 13.3.5.0.6 (moved by the resolver)",
        "nvidia-curand 10.4.0.35 → (removed) (moved by the resolver)",
        "triton 3.8.0 → 3.9.0 (moved by the resolver)",
    ]
    output = (
        "Discarding triton==3.8.0 (from -r cand.txt (line 2540)) to proceed the resolution\n"
        "Discarding nvidia_cublas==13.1.1.3 (from -r cand.txt (line 1507)) to proceed the resolution\n"
    )
    assert discarded(output) == ["nvidia-cublas", "triton"]


def test_a_baseline_is_reused_only_while_lock_code_and_age_fit(tmp_path):
    (tmp_path / "tests.json").write_text("{}")
    now = dt.datetime(2026, 12, 3, 12, tzinfo=dt.timezone.utc)
    run = TierRun(
        python="p",
        report_dir=str(tmp_path),
        finished=(now - dt.timedelta(hours=2)).isoformat(),
        lock_sha256=sha256(LOCK),
        code_sha256=code_sha256(),
    )
    assert baseline_is_current(run, LOCK, 24, now)
    assert not baseline_is_current(run, LOCK, 1, now)
    other = tmp_path / "other-lock.txt"
    other.write_text("torch==2.15.0\n")
    assert not baseline_is_current(run, other, 24, now)
    run.code_sha256 = "0" * 64
    assert not baseline_is_current(run, LOCK, 24, now)
    assert not baseline_is_current(None, LOCK, 24, now)


# --- the report, from recorded runs ---------------------------------------------------------------

CANARY = "tests/cpu/test_hf_compat_canaries.py::test_canary_rope_inv_freq_still_left_uninitialised"
HF_TEST = "tests/cpu/test_hf_backend.py::test_backend_step1_matches_native"
CLASS_TEST = "tests/cpu/test_x.py::TestThing::test_param[1]"
RANDOM_INIT = "tests/cpu/test_native_qwen3.py::test_random_init_loss"
EXACT = "tests/cpu/test_native_qwen3.py::test_step1_loss_hf"


def golden_row(key, lane, measured, verdict, test, published=None, golden=None):
    return {
        "recipe": "native_qwen3",
        "tier": "cpu",
        "key": key,
        "lane": lane,
        "published": published,
        "golden": golden,
        "measured": measured,
        "tolerance": 0.0,
        "verdict": verdict,
        "test": test,
    }


def write_run(
    directory: Path,
    outcomes: dict[str, str],
    goldens: list[dict],
    failures: dict[str, str] = {},
    properties: dict[str, dict] = {},
    versions: dict | None = None,
) -> Path:
    """A report dir as harness.pytest_plugins.report and pytest's --junitxml write it."""
    directory.mkdir(parents=True)
    tests = [
        {"test": t, "outcome": o, "duration_s": 1.0, "properties": properties.get(t, {})}
        for t, o in outcomes.items()
    ]
    data = {
        "versions": versions
        or {"torch": "2.14.0", "transformers": "5.16.0", "torchtitan": "0.3.0"},
        "goldens": goldens,
        "warnings": [],
        "tests": tests,
    }
    (directory / "tests.json").write_text(json.dumps(data))
    cases = []
    for test in outcomes:
        classname, name = junit_key(test)
        inner = (
            f'<failure message="{failures[test]}">traceback\nE   {failures[test]}</failure>'
            if test in failures
            else ""
        )
        cases.append(f'<testcase classname="{classname}" name="{name}" time="1">{inner}</testcase>')
    (directory / "junit.xml").write_text(
        f'<testsuites><testsuite name="pytest">{"".join(cases)}</testsuite></testsuites>'
    )
    return directory


@pytest.fixture
def recorded_runs(tmp_path):
    moved = [Move("transformers", "5.16.0", "5.23.0", True)]
    shape = shape_message(
        "transformers",
        "recipes.hf_compat.init_rotary_embeddings",
        "X.compute_default_rope_parameters(config)",
    )
    lock = write_run(
        tmp_path / "baseline",
        {
            CANARY: "passed",
            HF_TEST: "passed",
            CLASS_TEST: "passed",
            RANDOM_INIT: "passed",
            EXACT: "passed",
            LOCK_DRIFT_TEST: "passed",
        },
        [
            golden_row("step1_loss_random", "proxy", 12.4431, "pass", RANDOM_INIT, published=12.43),
            golden_row(
                "step1_loss_hf",
                "exact",
                1.5480120182037354,
                "pass",
                EXACT,
                golden=1.5480120182037354,
            ),
        ],
    )
    candidate = write_run(
        tmp_path / "candidate",
        {
            CANARY: "failed",
            HF_TEST: "failed",
            CLASS_TEST: "passed",
            RANDOM_INIT: "failed",
            EXACT: "failed",
            LOCK_DRIFT_TEST: "failed",
        },
        [
            golden_row(
                "step1_loss_random", "proxy", 12.6, "regression", RANDOM_INIT, published=12.43
            ),
            golden_row(
                "step1_loss_hf",
                "exact",
                1.5480124950408936,
                "stale golden",
                EXACT,
                golden=1.5480120182037354,
            ),
        ],
        failures={
            CANARY: "AssertionError: upstream now initialises inv_freq after to_empty(): drop init_rotary_embeddings",
            HF_TEST: f"shared run failed: rank 0 failed first: UpstreamShapeError: {shape}",
            RANDOM_INIT: "AssertionError: regression: step1_loss_random",
            EXACT: "AssertionError: stale golden",
            LOCK_DRIFT_TEST: "installed packages drifted",
        },
        properties={
            LOCK_DRIFT_TEST: {
                "lock_drift": [
                    "transformers: pinned 5.16.0 in requirements-lock.txt, installed 5.23.0"
                ]
            }
        },
        versions={"torch": "2.14.0", "transformers": "5.23.0", "torchtitan": "0.3.0"},
    )
    return load_run(lock), load_run(candidate), moved, shape


def test_the_comparison_names_flips_moves_broken_workarounds_and_claims(recorded_runs):
    lock, candidate, moved, shape = recorded_runs
    c = compare(lock, candidate, moved)
    changes = {r.test: r.change for r in c.rows}
    assert changes == {
        CANARY: "canary flipped",
        HF_TEST: "broke",
        CLASS_TEST: "same",
        RANDOM_INIT: "broke",
        EXACT: "broke",
        LOCK_DRIFT_TEST: "expected (the bump)",
    }
    (flip,) = c.canaries
    assert (
        flip.test == CANARY
        and "workaround can go" in flip.meaning
        and "drop init_rotary_embeddings" in flip.message
    )
    assert {g.key: (g.old, g.new) for g in c.goldens} == {
        "step1_loss_random": (12.4431, 12.6),
        "step1_loss_hf": (1.5480120182037354, 1.5480124950408936),
    }
    assert [g.difference for g in c.goldens if g.key == "step1_loss_hf"] == [
        pytest.approx(4.768e-7, rel=1e-3)
    ]
    (broken,) = c.workarounds
    assert broken.message == shape and broken.tests == (HF_TEST,)
    assert [(b.key, b.verdict) for b in c.published] == [("step1_loss_random", "regression")]
    assert c.exit_code == EXIT_PUBLISHED_BROKEN
    assert next(r for r in c.rows if r.test == HF_TEST).message == shape


def test_lock_coupled_unit_tests_are_expected_to_fail_when_they_name_a_moved_package(recorded_runs):
    (lock_results, goldens, versions), (cand_results, cand_goldens, cand_versions), moved, _ = (
        recorded_runs
    )
    coupled = LOCK_COUPLED_TESTS[0]
    lock = ({**lock_results, coupled: Result("passed")}, goldens, versions)
    message = '>       assert not any(p.startswith("transformers") for p in problems)\nE       assert not True'
    candidate = ({**cand_results, coupled: Result("failed", message)}, cand_goldens, cand_versions)
    assert {r.test: r.change for r in compare(lock, candidate, moved).rows}[
        coupled
    ] == "expected (the bump)"
    torch_only = [Move("torch", "2.14.0", "2.15.0", True)]
    assert {r.test: r.change for r in compare(lock, candidate, torch_only).rows}[coupled] == "broke"


def test_drift_in_a_package_the_bump_did_not_move_is_not_expected(recorded_runs):
    lock, candidate, _, _ = recorded_runs
    c = compare(lock, candidate, [Move("torch", "2.14.0", "2.15.0", True)])
    assert {r.test: r.change for r in c.rows}[LOCK_DRIFT_TEST] == "broke"


def test_a_claim_no_longer_measured_breaks_it(recorded_runs):
    lock, (results, goldens, versions), moved, _ = recorded_runs
    c = compare(
        lock, (results, [g for g in goldens if g["key"] != "step1_loss_random"], versions), moved
    )
    assert [(b.key, b.verdict) for b in c.published] == [
        ("step1_loss_random", "not measured on the candidate")
    ]


def test_a_bump_that_changes_nothing_reports_nothing(recorded_runs):
    lock, _, _, _ = recorded_runs
    c = compare(lock, lock, [])
    assert {r.change for r in c.rows} == {"same"}
    assert (c.canaries, c.goldens, c.workarounds, c.published, c.exit_code) == (
        [],
        [],
        [],
        [],
        EXIT_OK,
    )


def test_the_report_starts_with_the_table(tmp_path, recorded_runs, capsys):
    """End to end on recorded runs: --report-only with a given baseline writes .md and .json."""
    lock_dir, cand_dir = tmp_path / "baseline", tmp_path / "candidate"
    rehearsal = plan(NO_CHANGE, reports=tmp_path / "bump")
    resolve(rehearsal)
    cand_dir.rename(rehearsal.candidate_report)
    code = main(
        [
            "--report-only",
            "--reports",
            str(tmp_path / "bump"),
            "--baseline",
            str(lock_dir),
            *NO_CHANGE,
        ]
    )
    assert code == EXIT_PUBLISHED_BROKEN
    text = rehearsal.report_md.read_text().splitlines()
    assert text[0] == f"# Bump rehearsal: {NO_CHANGE[0]}"
    assert text[4] == "| test | lock | candidate | change | why (candidate's failure) |"
    assert text[6].startswith(f"| {CANARY} | passed | failed | canary flipped |")
    sections = [line for line in text if line.startswith("## ")]
    assert sections == [
        "## What moved in the lock",
        "## Canaries that flipped",
        "## Goldens that moved",
        "## Workarounds that broke",
        "## Published-number checks the candidate breaks",
        "## Runs",
    ]
    data = json.loads(rehearsal.report_json.read_text())
    assert (
        data["exit_code"] == 1
        and data["candidate_versions"] == "torch 2.14.0, transformers 5.23.0, torchtitan 0.3.0"
    )
    assert [w["tests"] for w in data["workarounds_broke"]] == [[HF_TEST]]
    out = capsys.readouterr().out
    assert "BROKEN published check: native_qwen3 step1_loss_random: regression" in out
    assert (
        f'make bisect BISECT_ARGS="--from-bump {rehearsal.report_json}"' in out
    )  # what broke, to harness/bump/bisect.py


def test_junit_names_map_to_test_ids():
    assert junit_key(CLASS_TEST) == ("tests.cpu.test_x.TestThing", "test_param[1]")
    assert junit_key(CANARY) == (
        "tests.cpu.test_hf_compat_canaries",
        "test_canary_rope_inv_freq_still_left_uninitialised",
    )


def test_the_telling_line_of_a_failure():
    launcher = (
        "failed on setup with \"Failed: shared run 'hf-backend-2proc' failed (see its rank logs below):\n"
        "hf_backend on cpu failed after 23 s: torchrun exited 1; rank 0 failed first: TypeError: boom.\n"
        "[rank0]: TypeError: boom"
    )
    assert first_line(launcher) == "TypeError: boom."
    in_a_subprocess = "E       AssertionError: Config field value\nE         [rank0]: KeyError: 'rope_theta'\nE       assert 1 == 0"
    assert first_line(in_a_subprocess) == "KeyError: 'rope_theta'"
    assert (
        first_line("traceback\nE   assert 12.6 == 12.43\nE    +  where") == "assert 12.6 == 12.43"
    )
    shape = shape_message("torch", "recipes.platform.cpu._patch_fsdp_sum_reduction", "FSDPModule.x")
    assert (
        first_line(f"E   recipes.upstream_shape.UpstreamShapeError: {shape}\n[rank0]: TypeError: x")
        == shape
    )


def test_a_run_sees_the_environment_make_test_would(tmp_path):
    """Under `make bump`, make's variables must not reach the tests (a test's `make -n` would print make[1])."""
    python = tmp_path / "venv" / "bin" / "python"
    base = {
        "PATH": "/usr/bin",
        "MAKELEVEL": "1",
        "MAKEFLAGS": "w",
        "MFLAGS": "-w",
        "VIRTUAL_ENV": "/x",
        "HOME": "/root",
    }
    env = tier_env(python, tmp_path / "report", base)
    assert env == {
        "PATH": f"{python.parent}:/usr/bin",
        "HOME": "/root",
        "QWEN3_REPRO_REPORT_DIR": str(tmp_path / "report"),
    }


def test_a_moved_curve_reads_as_its_length_ends_and_largest_step():
    old, new = [1.5, 1.4, 1.3, 1.2, 1.1], [1.5, 1.4, 1.3002, 1.2, 1.1001]
    assert difference(old, new) == pytest.approx(2e-4)
    assert difference(old, new[:4]) is None and difference(1.0, None) is None
    assert _golden_cell(new) == "5 steps: 1.5 … 1.1001"


def test_a_broke_that_passes_on_a_rerun_is_flaky_not_the_candidates_break():
    """A "broke" is re-run before it is reported (issue 38 point 5): flaky when any re-run passes."""
    from harness.bump.comparison import Comparison, Row

    rows = [
        Row("t::flaky", "passed", "failed", "broke", "AssertionError: rank 1's log"),
        Row("t::broken", "passed", "failed", "broke", "TypeError: x"),
        Row("t::same", "passed", "passed", "same"),
    ]
    judged = Comparison(rows, [], [], [], []).with_reruns(
        {"t::flaky": ["failed", "passed"], "t::broken": ["failed", "failed"]}
    )
    assert [(r.test, r.change) for r in judged.rows] == [
        ("t::flaky", "flaky (passed 1 of 2 re-runs)"),
        ("t::broken", "broke"),
        ("t::same", "same"),
    ]
    assert (
        judged.broke() == ["t::broken"]
        and judged.rows[1].message == "TypeError: x (failed 2 of 2 re-runs)"
    )


def test_a_rerun_runs_only_what_broke_serially(tmp_path):
    from harness.bump.tier import tier_command

    full = tier_command(Path("/v/bin/python"), tmp_path, tmp_path / "t")
    again = tier_command(
        Path("/v/bin/python"), tmp_path, tmp_path / "t", ("tests/cpu/test_x.py::a",)
    )
    assert "-n" in full and "auto" in full
    assert (
        "-n" not in again
        and again[again.index("-p") + 1] == "no:xdist"
        and "tests/cpu/test_x.py::a" in again
    )


@pytest.mark.slow
def test_rerun_broken_runs_the_tests_again_and_reads_their_outcomes(tmp_path):
    """Through real pytest, as a bump re-runs what broke: one test that passes, one that is not there."""
    import sys

    from harness.bump.__main__ import RERUNS, rerun_broken

    bump = plan(["transformers==5.23.0"], reports=tmp_path)
    bump.candidate_lock.parent.mkdir(parents=True, exist_ok=True)
    bump.candidate_lock.write_text("")  # resolve() writes it; the run records its hash
    passing = "tests/cpu/test_bump.py::test_a_rerun_runs_only_what_broke_serially"
    outcomes = rerun_broken(Path(sys.executable), bump, [passing], log=lambda line: None)
    assert outcomes == {passing: ["passed"] * RERUNS}
    assert (
        bump.candidate_report.parent / f"{bump.candidate_report.name}-rerun-{RERUNS}" / "tests.json"
    ).exists()
