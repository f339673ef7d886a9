"""The main job (`python -m harness run`, what `make repro` calls) fails when a check in its report fails."""

from __future__ import annotations

import json
import shutil

import pytest
from bad_inputs import harness_run

from recipes.tiers import FIXTURES


def test_a_failing_check_fails_the_main_job_and_is_reported(tmp_path):
    """A launch that succeeds but misses its golden exits 1, and the report keeps the measured value."""
    goldens_dir = tmp_path / "goldens"
    shutil.copytree(FIXTURES / "goldens", goldens_dir)
    path = goldens_dir / "native_qwen3" / "cpu.json"
    data = json.loads(path.read_text())
    data["values"]["step1_loss_hf"]["value"] = 1.25  # the fixture measures 1.548
    path.write_text(json.dumps(data))
    report_dir = tmp_path / "report"
    out = harness_run(report_dir, env={"QWEN3_GOLDENS_DIR": str(goldens_dir)}, timeout=600)
    assert out.returncode == 1, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    assert (
        "FAILED check: regression: step1_loss_hf" in out.stderr
        or "FAILED check: stale golden" in out.stderr
    )
    results = json.loads((report_dir / "results.json").read_text())
    (check,) = [c for c in results["checks"] if c["key"] == "native_qwen3.cpu.step1_loss_hf"]
    assert (check["lane"], check["golden"], check["published"], check["passed"]) == (
        "exact",
        1.25,
        None,
        False,
    )
    assert check["measured"] == pytest.approx(1.548, abs=1e-3)
    markdown = (report_dir / "results.md").read_text()
    assert (
        "**FAIL:" in markdown and "Josh Longenecker" in markdown and "shared/seed" not in markdown
    )
    # the job reports its own wall time and the share spent outside training steps
    timing = results["timing"]
    assert timing["wall_s"] >= timing["launches_s"] >= timing["training_steps_s"] > 0, timing
    assert 0 < timing["outside_training_share"] < 1, timing
    assert "Time of the last `python -m harness run`:" in markdown
    assert f"{timing['wall_s']:.0f} s wall" in out.stdout
