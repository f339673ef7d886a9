"""The suite's own machinery: goldens loader, stale-vs-regression, report plugin, CI files and guard."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from harness.judge import goldens, verdicts
from recipes.tiers import REPO_ROOT


def write(path: Path, values: dict, metadata: dict | None = None) -> Path:
    path.write_text(json.dumps({"metadata": metadata or {}, "values": values}))
    return path


ENTRY = {"value": 1.5, "tolerance": 0.0, "lane": "exact", "reason": "deterministic"}


def test_every_shipped_goldens_file_loads():
    files = sorted(goldens.GOLDENS_DIR.glob("*/*.json"))
    assert files, "no goldens files shipped"
    for path in files:
        recipe, tier = path.parent.name, path.stem
        _, values = goldens.load(recipe, tier)
        assert values, path


def test_every_claim_entry_of_every_goldens_file_is_the_tutorials_number():
    """Published and proxy entries carry no number of their own: each names a claim of
    harness.declare.published (the one place the tutorial's numbers are written) and states why."""
    from harness.declare.published import CLAIMS

    seen = set()
    for path in sorted(goldens.GOLDENS_DIR.glob("*/*.json")):
        raw = json.loads(path.read_text())["values"]
        _, values = goldens.load(path.parent.name, path.stem)
        for key, g in values.items():
            if g.lane not in goldens.CLAIM_LANES:
                continue
            assert "value" not in raw[key], f"{path}: {key}"
            # (its value is CLAIMS[claim] by construction: goldens.load); it must name the claim it stands for
            if g.lane == "published":
                assert key == g.claim, f"{path}: {key} judges the claim {g.claim!r}"
            else:
                assert key.startswith(g.claim + "_"), (
                    f"{path}: proxy {key} stands for {g.claim!r}: name it after it"
                )
            assert g.reason, f"{path}: {key}"
            if g.lane == "published":
                assert path.stem == "trn2", (
                    f"{path}: {key}: published numbers are judged only where the tutorial ran"
                )
            seen.add(g.claim)
    assert seen == set(CLAIMS), f"claims no goldens file judges: {sorted(set(CLAIMS) - seen)}"


@pytest.mark.parametrize(
    "entry, message",
    [
        ({**ENTRY, "value": float("nan")}, "not finite"),
        ({**ENTRY, "value": float("inf")}, "not finite"),
        ({k: v for k, v in ENTRY.items() if k != "tolerance"}, "has no 'tolerance'"),
        ({k: v for k, v in ENTRY.items() if k != "reason"}, "has no 'reason'"),
        ({k: v for k, v in ENTRY.items() if k != "value"}, "has no 'value'"),
        ({**ENTRY, "colour": "red"}, "unknown field(s) ['colour']"),
        ({**ENTRY, "lane": "vibes"}, "lane 'vibes'"),
        ({**ENTRY, "tolerance": -1}, "tolerance -1"),
        ({**ENTRY, "lane": "published"}, "written only in harness/declare/published.py"),
        (
            {
                "claim": "step1_loss_hf",
                "tolerance": 0.1,
                "lane": "published",
                "reason": "r",
                "value": 6.5,
            },
            "own 'value'",
        ),
        (
            {"claim": "step1_loss_zz", "tolerance": 0.1, "lane": "proxy", "reason": "r"},
            "claim 'step1_loss_zz'",
        ),
        ({**ENTRY, "claim": "step1_loss_hf"}, "cannot name a claim"),
    ],
)
def test_loader_rejects_untrustworthy_goldens(tmp_path, entry, message):
    path = write(tmp_path / "g.json", {"step1_loss_hf": entry})
    with pytest.raises(goldens.GoldenError) as error:
        goldens.load("r", "t", path)
    assert message in str(error.value) and str(path) in str(error.value)


def test_loader_rejects_unknown_top_level_keys(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"metadata": {}, "values": {}, "notes": 1}))
    with pytest.raises(goldens.GoldenError, match="unknown top-level"):
        goldens.load("r", "t", path)


def test_mismatch_is_regression_in_the_recorded_environment_and_stale_elsewhere(tmp_path):
    env = goldens.environment_metadata()
    assert {"cpu_capability", "cpu_model", "isa", "blas"} <= set(env["cpu"])
    values = {"k": goldens.Golden("k", 1.5, 0.0, "exact", "deterministic")}
    assert verdicts.compare("k", 1.5, values, env, env).kind == "pass"
    assert verdicts.compare("k", 1.5 + 1e-7, values, env, env).kind == "regression"
    assert verdicts.compare("k", 1.6, values, env, env).kind == "regression"
    other_cpu = {**env, "cpu": {**env["cpu"], "cpu_model": "Some Other CPU"}}
    portable = verdicts.compare("k", 1.5 + 1e-7, values, other_cpu, env)
    assert (portable.kind, portable.passed, portable.differs) == (
        "pass, other environment",
        True,
        ("cpu.cpu_model",),
    )
    stale = verdicts.compare("k", 1.6, values, other_cpu, env)
    assert (stale.kind, stale.passed) == ("stale golden", False)
    assert "cpu.cpu_model" in stale.message() and "make goldens ACCEPT=1" in stale.message()
    other_torch = {**env, "versions": {**env["versions"], "torch": "0.0.1"}}
    assert verdicts.compare("k", 1.6, values, other_torch, env).kind == "stale golden"


def test_update_refuses_non_finite_and_never_touches_claims(tmp_path, monkeypatch):
    monkeypatch.setattr(goldens, "GOLDENS_DIR", tmp_path)
    (tmp_path / "r").mkdir()
    pub = {"claim": "step1_loss_hf", "lane": "published", "tolerance": 0.02, "reason": "tutorial"}
    write(tmp_path / "r" / "t.json", {"pub": pub})
    with pytest.raises(goldens.GoldenError, match="non-finite"):
        goldens.update_exact("r", "t", {"x": float("nan")}, {"x": "why"})
    with pytest.raises(goldens.GoldenError, match="never regenerated"):
        goldens.update_exact("r", "t", {"pub": 6.0}, {"pub": "why"})
    goldens.update_exact("r", "t", {"x": 2.5}, {"x": "measured"})
    metadata, values = goldens.load("r", "t")
    assert values["x"].value == 2.5 and values["pub"].value == 6.54
    assert metadata == goldens.environment_metadata()


def test_make_goldens_lists_changes_and_writes_only_when_accepted(tmp_path, monkeypatch):
    monkeypatch.setattr(goldens, "GOLDENS_DIR", tmp_path)
    (tmp_path / "r").mkdir()
    path = write(tmp_path / "r" / "t.json", {"a": ENTRY, "b": {**ENTRY, "value": 2.0}})
    before = path.read_text()
    proposals = [
        {"recipe": "r", "tier": "t", "key": "a", "value": 1.5, "reason": ""},
        {"recipe": "r", "tier": "t", "key": "b", "value": 2.25, "reason": ""},
        {"recipe": "r", "tier": "t", "key": "c", "value": 3.0, "reason": "new one"},
    ]
    changes = goldens.proposed_changes(proposals)
    text = goldens.format_changes(changes, len(proposals))
    assert text.splitlines() == [
        "goldens: 3 exact value(s) measured, 2 would change",
        "  changed  r/t b: 2.0 → 2.25  (Δ +0.25)",
        "  new      r/t c = 3.0",
    ]
    assert path.read_text() == before
    goldens.apply_changes(changes, proposals)
    _, values = goldens.load("r", "t")
    assert (values["a"].value, values["b"].value, values["c"].value) == (1.5, 2.25, 3.0)
    assert values["b"].reason == "deterministic" and values["c"].reason == "new one"


def test_update_writes_only_what_this_run_measured(tmp_path, monkeypatch):
    """The file's environment speaks for every exact value in it: a value this run did not measure is not re-stamped."""
    monkeypatch.setattr(goldens, "GOLDENS_DIR", tmp_path)
    (tmp_path / "r").mkdir()
    elsewhere = {**goldens.environment_metadata(), "lock_sha256": "another lock"}
    path = write(tmp_path / "r" / "t.json", {"a": ENTRY, "b": {**ENTRY, "value": 2.0}}, elsewhere)
    before = path.read_text()
    with pytest.raises(
        goldens.GoldenError,
        match=r"\['a'\] were not measured in this run .* differs \(lock_sha256\)",
    ):
        goldens.update_exact("r", "t", {"b": 2.25}, {})
    assert path.read_text() == before
    # The run measured a too (unchanged): both now stand for this environment.
    goldens.update_exact("r", "t", {"b": 2.25}, {}, unchanged=["a"])
    metadata, values = goldens.load("r", "t")
    assert (metadata, values["a"].value, values["b"].value) == (
        goldens.environment_metadata(),
        1.5,
        2.25,
    )
    # Recorded here already: a value changed alone leaves the others' environment true.
    goldens.update_exact("r", "t", {"b": 2.5}, {})
    assert goldens.load("r", "t")[1]["b"].value == 2.5


def run_pytest(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "harness.pytest_plugins.report",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO_ROOT)},
    )


def test_report_plugin_writes_json_markdown_and_junit_properties_pass_or_fail(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        textwrap.dedent(
            """
            def test_passes(record_property):
                record_property("measured_loss", 1.25)

            def test_fails(record_property):
                record_property("measured_diff", 0.5)
                assert False
            """
        )
    )
    junit = tmp_path / "junit.xml"
    report = tmp_path / "report"
    out = run_pytest(
        "test_sample.py", f"--junitxml={junit}", f"--report-dir={report}", cwd=tmp_path
    )
    assert out.returncode == 1, out.stdout
    data = json.loads((report / "tests.json").read_text())
    outcomes = {t["test"].split("::")[1]: (t["outcome"], t["properties"]) for t in data["tests"]}
    assert outcomes["test_passes"] == ("passed", {"measured_loss": 1.25})
    assert outcomes["test_fails"] == ("failed", {"measured_diff": 0.5})
    markdown = (report / "tests.md").read_text()
    assert "measured_loss=1.25" in markdown and "measured_diff=0.5" in markdown
    xml = junit.read_text()
    assert 'name="measured_loss" value="1.25"' in xml and 'name="measured_diff" value="0.5"' in xml


def test_report_plugin_records_deprecation_warnings_under_xdist(tmp_path):
    """The repo's pytest.ini silences no warning category suite-wide; each one reaches tests.json and tests.md."""
    import configparser

    ini = configparser.ConfigParser()
    ini.read(REPO_ROOT / "pytest.ini")
    filters = [f.strip() for f in ini["pytest"].get("filterwarnings", "").splitlines() if f.strip()]
    # action:message:category:module:lineno; an ignore must name its module
    suite_wide = [
        f for f in filters if f.startswith("ignore") and not (f.split(":") + [""] * 4)[3].strip()
    ]
    assert suite_wide == [], f"silenced suite-wide: {suite_wide}"
    (tmp_path / "test_warns.py").write_text(
        textwrap.dedent(
            """
            import warnings

            def test_uses_an_old_api():
                warnings.warn("old_api() is deprecated; use new_api()", DeprecationWarning)
            """
        )
    )
    report = tmp_path / "report"
    out = run_pytest("test_warns.py", "-n", "2", f"--report-dir={report}", cwd=tmp_path)
    assert out.returncode == 0, out.stdout
    warnings = json.loads((report / "tests.json").read_text())["warnings"]
    assert [(w["category"], w["message"], w["tests"]) for w in warnings] == [
        (
            "DeprecationWarning",
            "old_api() is deprecated; use new_api()",
            ["test_warns.py::test_uses_an_old_api"],
        )
    ]
    assert "old_api() is deprecated" in (report / "tests.md").read_text()


@pytest.mark.slow
def test_zero_tests_guard_fails_when_every_neuron_test_skipped(tmp_path):
    report = tmp_path / "report"
    out = run_pytest("-m", "neuron", "tests/neuron", f"--report-dir={report}", "-q", cwd=REPO_ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads((report / "tests.json").read_text())
    assert data["tests"] and all(t["outcome"] == "skipped" for t in data["tests"])
    assert all("no Neuron device" in t["properties"]["skip_reason"] for t in data["tests"])
    guard = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.night.ci",
            "require-ran",
            str(report / "tests.json"),
            "--marker",
            "neuron",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert guard.returncode == 1
    assert f"0 of {len(data['tests'])} neuron tests actually ran" in guard.stderr


def test_workflows_parse_and_call_the_readme_commands():
    readme = (REPO_ROOT / "README.md").read_text()
    assert "make repro" in readme and "make test" in readme
    cpu = yaml.safe_load((REPO_ROOT / ".github/workflows/cpu.yml").read_text())
    cpu_steps = " ".join(step.get("run", "") for step in cpu["jobs"]["cpu"]["steps"])
    assert "make test" in cpu_steps
    ci_run = (REPO_ROOT / ".ci/run").read_text()
    for runner, steps in (("cpu.yml", cpu_steps), (".ci/run", ci_run)):
        assert "make lint" in steps, f"{runner} does not run the stage contracts and the format"
    nightly = yaml.safe_load((REPO_ROOT / ".github/workflows/nightly-trn2.yml").read_text())
    job = nightly["jobs"]["neuron"]
    assert job["runs-on"] == ["self-hosted", "trn2"]
    assert "schedule" in nightly[True] or "schedule" in nightly.get(
        "on", {}
    )  # YAML 1.1 reads `on` as True
    nightly_steps = " ".join(step.get("run", "") for step in job["steps"])
    for needed in (
        "neuron-ls",
        "make neuron-venv",
        "pytest -m neuron",
        "harness.night.ci require-ran",
        "harness.night.ci trend",
    ):
        assert needed in nightly_steps, needed
    assert "make rehearse-trn2" in ci_run and ci_run.rstrip().endswith(
        "make test"
    )  # pytest's summary closes CI
    assert "make rehearse-trn2" in " ".join(
        step.get("run", "") for step in cpu["jobs"]["rehearse-trn2"]["steps"]
    )


def test_the_golden_fixture_refuses_a_tier_other_than_the_one_under_test(golden):
    """A cpu test cannot judge (or record) a trn2 golden, even one whose value it would match."""
    from harness.declare.published import CLAIMS

    with pytest.raises(
        pytest.fail.Exception, match=r"in a cpu test .* only its own tier's goldens \('cpu'\)"
    ):
        golden("native_qwen3", "trn2", "step1_loss_hf", CLAIMS["step1_loss_hf"].value)
