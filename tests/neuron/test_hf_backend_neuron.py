"""Tutorial config 1 (HF Transformers backend) at full size on a trn2.48xlarge: 6.54, 12.43, export round trip."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from recipes.platform.neuron import neuron_status
from recipes.published import CLAIMS

STATUS = neuron_status()
MODEL_DIR = Path(os.environ["QWEN3_4B_DIR"]) if os.environ.get("QWEN3_4B_DIR") else None
NPROC = 64

TOLERANCES = {"step1_loss_hf": 0.02, "step1_loss_random": 0.03}
"""Tolerances of the published claims (to move into fixtures/goldens/hf_backend/trn2.json).

- step1_loss_hf, 6.54 ± 0.02: published to 2 decimals (±0.005); bf16 on 64
  ranks reorders reductions against the tutorial's run.
- step1_loss_random, 12.43 ± 0.03: published to 2 decimals; the backend's tied
  init (std d^-1/2, truncated at 3σ) gives logits of variance 0.973, so
  CE ≈ ln 151936 + 0.487 = 12.418, 0.012 from 12.43; 64 × 2048 sampled tokens
  spread it by < 0.002.
"""


def _weights_reason() -> str | None:
    if MODEL_DIR is None:
        return "QWEN3_4B_DIR is not set: point it at a local copy of Qwen/Qwen3-4B-Instruct-2507"
    if not any(MODEL_DIR.glob("*.safetensors")):
        return f"QWEN3_4B_DIR={MODEL_DIR} has no weights (*.safetensors)"
    return None


MISSING = [reason for reason in (None if STATUS.ready else STATUS.reason(), _weights_reason()) if reason]
pytestmark = [pytest.mark.neuron, pytest.mark.skipif(bool(MISSING), reason=" ".join(MISSING))]


@pytest.fixture(scope="module")
def trn2_hf_run(recipe_run, shared_dir):
    return recipe_run(
        "trn2-hf-backend-hf",
        recipe="hf_backend",
        tier="trn2",
        nproc=NPROC,
        steps=3,
        init="hf",
        model_dir=MODEL_DIR,
        export_dir=shared_dir / "trn2-hf-backend-export",
        seed=0,
    )


def assert_published(key: str, measured: float, record_property) -> None:
    published, tolerance = CLAIMS[key].value, TOLERANCES[key]
    record_property(f"hf_backend.trn2.{key}", measured)
    assert abs(measured - published) <= tolerance, f"{key}: {measured:.4f}, published {published} ± {tolerance}"


def test_published_step1_loss_from_pretrained_weights(trn2_hf_run, record_property):
    assert_published("step1_loss_hf", trn2_hf_run["losses"][0], record_property)


def test_published_step1_loss_from_random_init(recipe_run, record_property):
    run = recipe_run(
        "trn2-hf-backend-random", recipe="hf_backend", tier="trn2", nproc=NPROC, steps=1, init="random",
        model_dir=MODEL_DIR, seed=0, export=False,
    )  # fmt: skip
    assert_published("step1_loss_random", run["losses"][0], record_property)


def test_export_round_trip(trn2_hf_run, record_property):
    """The export loads into transformers with only the tied head missing, under the source's config."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    export = Path(trn2_hf_run["export_dir"])
    source = json.loads((MODEL_DIR / "config.json").read_text())
    source.pop("torch_dtype", None)
    assert json.loads((export / "config.json").read_text()) == {**source, "dtype": "bfloat16"}

    state = {}
    for path in sorted(export.glob("*.safetensors")):
        state.update(load_file(path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(export))
    result = model.load_state_dict(state, strict=False, assign=True)
    record_property("hf_backend.trn2.export_missing_keys", sorted(result.missing_keys))
    assert sorted(result.missing_keys) == CLAIMS["export_missing_keys"].value
    assert sorted(result.unexpected_keys) == CLAIMS["export_unexpected_keys"].value
    assert all(torch.isfinite(tensor).all() for tensor in state.values())
