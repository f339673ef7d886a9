"""A failing published or exact claim leaves a report ready to paste upstream (harness/night/upstream.py)."""

from __future__ import annotations

import json

from harness.launch import speed
from harness.night import upstream

SECTIONS = [
    "## Versions",
    "## Inputs",
    "## Reproduce",
    "## Host reference",
    "## First diverging layer",
    "## Release that moved it",
    "## First night it moved",
]


def row(
    key: str,
    verdict: str,
    lane: str = "exact",
    tier: str = "cpu",
    measured=1.61,
    golden=1.548012,
    published=None,
    tolerance=0.0,
    test: str = "tests/cpu/test_native_qwen3.py::test_step1",
) -> dict:
    return {
        "recipe": "native_qwen3",
        "tier": tier,
        "key": key,
        "lane": lane,
        "published": published,
        "golden": golden,
        "measured": measured,
        "tolerance": tolerance,
        "verdict": verdict,
        "test": test,
    }


def test_a_failing_claim_gets_a_report_with_every_field_and_a_passing_one_none(
    tmp_path, monkeypatch
):
    log = tmp_path / "runs.jsonl"
    for night, loss in (("n1", 6.541), ("n2", 7.20), ("n3", 7.21)):
        speed.append_record(
            log,
            {
                **speed.run_record(
                    {
                        "run_dir": "/r/runs/x-1",
                        "recipe": "native_qwen3",
                        "tier": "trn2",
                        "init": "hf",
                        "losses": [loss],
                    },
                    versions={"torch": "2.14.0"},
                    night=night,
                )
            },
        )
    monkeypatch.setenv(speed.RUNS_LOG_ENV, str(log))
    neuron_test = "tests/neuron/test_native_qwen3_neuron.py::test_published_step1_loss_from_pretrained_weights"
    inputs = {"weights": {"model.safetensors": "a" * 64}}
    rows = [
        row(
            "step1_loss_hf",
            "rehearsal, regression",
            lane="published",
            tier="trn2",
            measured=7.2,
            golden=None,
            published=6.54,
            tolerance=0.02,
            test=neuron_test,
        ),
        row("step1_loss_random", "pass", lane="published", tier="trn2", test=neuron_test),
        row("step1_loss_hf", "unmeasured", lane="published", tier="trn2", test=neuron_test),
        row("loss_curve_100", "stale golden"),
    ]
    records = [
        {
            "test": neuron_test,
            "properties": {
                "native_qwen3.trn2.step1_loss_hf.inputs": inputs,
                "trn2.config2.as_published.reference": {"verdict": "agrees"},
            },
        }
    ]
    bisections = tmp_path / "bisect"
    bisections.mkdir()
    (bisections / "transformers-5.23.0.json").write_text(
        json.dumps(
            {
                "headline": "transformers 5.19.0 → 5.20.0 moves native_qwen3.trn2.step1_loss_hf: 6.54 → 7.2",
                "tests": [neuron_test],
                "moved": [["native_qwen3.trn2.step1_loss_hf", 6.54, 7.2]],
            }
        )
    )
    (bisections / "torch-2.15.0.json").write_text(
        json.dumps(
            {
                "headline": "torch 2.14.0 → 2.14.1 breaks tests/cpu/test_other.py::test_x",
                "tests": ["tests/cpu/test_other.py::test_x"],
            }
        )
    )
    (bisections / "cut-short.json").write_text("{")
    written = upstream.write(
        tmp_path / "report",
        rows,
        records,
        {"torch": "2.14.0", "transformers": "5.16.0"},
        bisections,
    )
    assert sorted(p.name for p in written) == [
        "native_qwen3.cpu.loss_curve_100.md",
        "native_qwen3.trn2.step1_loss_hf.md",
    ]
    text = (tmp_path / "report/upstream/native_qwen3.trn2.step1_loss_hf.md").read_text()
    assert text.startswith("# native_qwen3.trn2.step1_loss_hf moved: rehearsal, regression")
    assert [s for s in SECTIONS if s not in text] == []
    assert (
        "| 6.54 | 7.2 | 0.02 | published |" in text
        and "- transformers 5.16.0" in text
        and "lock sha256 " in text
    )
    assert json.dumps(inputs, indent=1, sort_keys=True) in text
    assert f"python -m pytest '{neuron_test}' -m neuron -p no:xdist" in text
    assert '"verdict": "agrees"' in text
    assert (
        "## First diverging layer\n\nnot run for this claim: no host reference here recorded a localization"
        in text
    )
    assert "night n2 " in text and "step 1 7.2" in text  # n1 was within 0.02 of 6.54
    assert (
        "## Release that moved it\n\n- `transformers-5.23.0.json`: transformers 5.19.0 → 5.20.0 moves "
        "native_qwen3.trn2.step1_loss_hf: 6.54 → 7.2\n\n## First night"
    ) in text  # the torch report is another test's
    cpu = (tmp_path / "report/upstream/native_qwen3.cpu.loss_curve_100.md").read_text()
    assert (
        "not in the runs log" in cpu
        and "-m cpu -p no:xdist" in cpu
        and "the cpu tier's fixtures" in cpu
    )
    assert f"not bisected: no report in {bisections} names this test; " in cpu
    assert 'TEST="tests/cpu/test_native_qwen3.py::test_step1"' in cpu
