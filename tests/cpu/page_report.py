"""Report directories made by hand for the page's tests: a main job's and a rehearsal night's.

Their JSON has the structure a real ``python -m harness run`` and a real night write (results.json,
tests.json, launches.json, provenance.json, the runs log); the loss PNGs are drawn by the report's
own matplotlib writer, the trend PNGs by ``harness.report.history``. No launch: each builds in well
under a second.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from harness.report import history
from harness.report import markdown as report_markdown
from harness.report import results as report
from recipes.tiers import REHEARSAL_MARK

VERSIONS = {"torch": "2.14.0", "torchtitan": "0.3.0", "transformers": "5.16.0", "python": "3.11.7"}
TOKENIZER_SHA = "cc17eaf61edf4e27dd448b1f2d819a6e99d40e6ae21218107d9473d9077cfe3e"


@dataclass
class Built:
    """A report directory, what its page must show, and the runs log beside it (if any)."""

    report_dir: Path
    claims: dict[str, str]
    failing: list[str]
    runs_log: Path | None = None
    run_dirs: list[Path] = field(default_factory=list)


def run_dir(parent: Path, name: str) -> Path:
    """A run directory as the launcher and ranks leave it: run.json, provenance, rank logs."""
    path = parent / name
    for rank in (0, 1):
        logs = path / "logs" / "d1f9fabf_kmqhgarp" / "attempt_0" / str(rank)
        logs.mkdir(parents=True)
        (logs / "stdout.log").write_text(f"rank {rank} step 1 loss 1.5\n")
        (logs / "stderr.log").write_text("")
    (path / "run.json").write_text("{}\n")
    (path / "console.log").write_text("step 1/2\n")
    inputs = {
        "tokenizer": {"tokenizer.json": TOKENIZER_SHA},
        "dataset": {"train.jsonl": "1156c5d3"},
    }
    (path / "provenance.json").write_text(json.dumps({"inputs": inputs}) + "\n")
    return path


def speed(step_time_s: float) -> dict:
    return {
        "step_time_s": step_time_s,
        "tokens_per_s": 4096 / step_time_s,
        "tokens_per_s_node": 8192 / step_time_s,
        "tflops": 0.016,
        "peak_tflops": None,
        "mfu_pct": None,
        "time_to_first_step_s": 3.1,
        "neff_cache": "n/a",
    }


def run(run_dir_: Path, init: str, losses: list[float], reference: dict | None = None) -> dict:
    """One entry of results.json's ``runs`` (``RunResult.to_dict()`` and what the main job adds)."""
    steps = [
        {"step": i + 1, "loss": loss, "step_time_s": 0.13, "tokens_per_s": 4100.0}
        for i, loss in enumerate(losses)
    ]
    return {
        "recipe": "native_qwen3",
        "tier": "cpu",
        "init": init,
        "nproc": 2,
        "seq_len": 256,
        "local_batch_size": 2,
        "run_dir": str(run_dir_),
        "steps": steps,
        "losses": losses,
        "speed": speed(0.13),
        "reference": reference,
        "versions": VERSIONS,
    }


def main_job(root: Path, failing_reference: bool = False) -> Built:
    """The main job's report: an exact check that passes, a proxy that fails, a host reference."""
    report_dir = root / "report"
    hf = run_dir(report_dir / "runs", "native_qwen3-cpu-hf-20261207-124531")
    rnd = run_dir(report_dir / "runs", "native_qwen3-cpu-random-20261207-124531")
    ref = {
        "measured": 1.548,
        "reference": 1.548,
        "tolerance": 1e-5,
        "passed": True,
        "error": None,
        "verdict": "agrees with the reference",
        "tolerance_reason": "fp32 on both sides",
        "diagnosis": "",
        "localization": None,
    }
    if failing_reference:
        ref = {
            **ref,
            "passed": False,
            "reference": 1.9,
            "verdict": "differs from the reference",
            "diagnosis": "rope_theta (theta 5x off; effect +0.35)",
            "localization": {
                "summary": "first diverging module: layers.0.attention (max |Δ| 0.41)"
            },
        }
    runs = [run(hf, "hf", [1.548, 1.51, 1.43], ref), run(rnd, "random", [6.97, 6.7, 6.47])]
    checks = [
        {
            "key": "native_qwen3.cpu.step1_loss_hf",
            "lane": "exact",
            "claim": None,
            "measured": 1.548,
            "published": None,
            "golden": 1.548,
            "tolerance": 0.0,
            "passed": True,
            "verdict": "pass",
            "reason": "fixture checkpoint <seed 0> & 2 ranks: deterministic on the pinned cpu lock",
        },
        {
            "key": "native_qwen3.cpu.step1_loss_random_4b_width",
            "lane": "proxy",
            "claim": "step-1 loss, random init (Qwen3-4B width/vocab)",
            "measured": 12.9,
            "published": 12.43,
            "golden": None,
            "tolerance": 0.21,
            "passed": False,
            "verdict": "regression",
            "reason": "cpu PROXY of the tutorial's random-init 12.43",
        },
    ]
    results = {
        "source": "the tutorial",
        "runs": runs,
        "checks": checks,
        "versions": VERSIONS,
        "timing": report_markdown.run_timing(60.0, runs),
    }
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / report.RESULTS_JSON).write_text(json.dumps(results, indent=2) + "\n")
    report.plot_loss_curves(report_dir, runs)
    upstream = report_dir / "upstream" / "native_qwen3.cpu.step1_loss_random_4b_width.md"
    upstream.parent.mkdir()
    upstream.write_text("# step1_loss_random_4b_width moved\n\nmeasured 12.9, published 12.43\n")
    claims = {c["key"]: c["verdict"] for c in checks}
    claims["native_qwen3-cpu-hf.reference"] = ref["verdict"]
    failing = ["native_qwen3.cpu.step1_loss_random_4b_width"]
    return Built(
        report_dir,
        claims,
        failing + ["native_qwen3-cpu-hf.reference"] * failing_reference,
        run_dirs=[hf, rnd],
    )


def runs_log(path: Path, rehearsal: bool) -> Path:
    """Two nights of run records, torch bumped on the second (a version change to mark)."""
    mark = {"rehearsal": REHEARSAL_MARK} if rehearsal else {}
    lines = []
    for night, torch, step_time in (("2026-12-06", "2.13.0", 4.2), ("2026-12-07", "2.14.0", 4.0)):
        for label, init, loss in (
            ("config2-as_published", "hf", 6.55),
            ("config2-as_published-random", "random", 12.44),
        ):
            lines.append(
                {
                    "kind": "run",
                    "date": f"{night}T03:00:00Z",
                    "night": night,
                    "label": label,
                    "recipe": "native_qwen3",
                    "tier": "trn2",
                    "init": init,
                    "nproc": 2,
                    "step1_loss": loss,
                    "published": {"key": f"step1_loss_{init}", "value": loss},
                    "speed": speed(step_time),
                    "versions": {**VERSIONS, "torch": torch},
                    **mark,
                }
            )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def night(root: Path, rehearsal: bool = True) -> Built:
    """A night's report (rehearsed or not): tests.json, launches.json, the runs log beside it."""
    report_dir = root / "report"
    session = report_dir / "runs" / "night-abc123"
    dirs = [
        run_dir(session, "config2-as_published"),
        run_dir(session, "config2-as_published-random"),
    ]
    mark = {"rehearsal": REHEARSAL_MARK} if rehearsal else {}
    prefix = "rehearsal, " if rehearsal else ""
    rows = [
        {
            "recipe": "native_qwen3",
            "tier": "trn2",
            "key": "step1_loss_hf",
            "lane": "published",
            "published": 6.54,
            "golden": None,
            "measured": 6.55,
            "tolerance": 0.02,
            "verdict": f"{prefix}pass",
            "test": "tests/neuron/test_published.py::test_step1_loss[config2-hf]",
            **mark,
        },
        {
            "recipe": "native_qwen3",
            "tier": "trn2",
            "key": "step1_loss_random",
            "lane": "published",
            "published": 12.43,
            "golden": None,
            "measured": 12.6,
            "tolerance": 0.03,
            "verdict": f"{prefix}regression",
            "test": "tests/neuron/test_published.py::test_step1_loss[config2-random]",
            **mark,
        },
        {
            "recipe": "hf_backend",
            "tier": "trn2",
            "key": "export_missing_keys",
            "lane": "published",
            "published": ["lm_head.weight"],
            "golden": None,
            "measured": None,
            "tolerance": 0.0,
            "verdict": f"{prefix}unmeasured",
            "test": "tests/neuron/test_export.py::test_round_trip",
            **mark,
        },
    ]
    lanes = [
        {
            "recipe": "native_qwen3",
            "causes": {"as published vs published": "not reproduced: Δ +0.17"},
        }
    ]
    tests = {
        **mark,
        "versions": VERSIONS,
        "goldens": rows,
        "lanes": lanes,
        "warnings": [],
        "tests": [],
    }
    (report_dir / "tests.json").write_text(json.dumps(tests, indent=2) + "\n")
    launches = {
        "config2-as_published": {
            "launch_min": 31.25,
            "reference_min": 14.0,
            "steps": 20,
            "stopped": None,
        }
    }
    (report_dir / "launches.json").write_text(json.dumps(launches) + "\n")
    log = runs_log(root / "runs.jsonl", rehearsal)
    claims = {f"{r['recipe']}.{r['tier']}.{r['key']}": r["verdict"] for r in rows}
    return Built(report_dir, claims, ["native_qwen3.trn2.step1_loss_random"], log, dirs)


def trend_files(report_dir: Path) -> list[str]:
    """The trend PNGs the page must show: every plot ``harness.report.history`` drew into the report."""
    summary = json.loads((report_dir / "history" / history.SUMMARY).read_text())
    return [plot["file"] for plot in summary["plots"].values()]
