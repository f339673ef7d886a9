"""Tutorial config 1 on trn2 as published and with each known defect fixed, each beside the reference.

The published 6.54 from Qwen3-4B-Instruct-2507 weights is about 2.5x what a sound 4B model
scores on web text. Two upstream defects of torchtitan's Transformers backend, each alone,
give numbers like it; this file runs config 1 on the 64 NeuronCores four ways and, for each,
scores the run's own first global batch with transformers in fp32 on the host
(``harness.reference``), so the report says what the weights score and why a lane differs:

=================  ==========================  ===========================================
lane               tokenizer (hf_assets_path)  RoPE inv_freq
=================  ==========================  ===========================================
as_published       torchtitan's test BPE        upstream init: as to_empty() left it
tokenizer_fixed    the weights' own             upstream init
inv_freq_fixed     torchtitan's test BPE        recomputed (recipes.hf_compat workaround 1)
corrected          the weights' own             recomputed: the recipe as the suite runs it
=================  ==========================  ===========================================

The defects, in pytorch/torchtitan's sources (the TorchTitan Neuron fork is not public, so
that it carries both unchanged is what the as_published lane measures):

* tokenizer: ``transformers_modeling_backend_full()``
  (torchtitan/experiments/transformers_modeling_backend/config_registry.py) sets
  ``hf_model`` but no ``hf_assets_path``, so ``Trainer.Config.hf_assets_path`` keeps its
  default ``"./tests/assets/tokenizer"`` (torchtitan/trainer.py): the repository's test BPE
  (tests/assets/tokenizer/tokenizer.json, 2,020 ids), relative to the working directory --
  a TorchTitan Neuron checkout in the tutorial's setup. Nothing checks it against the
  model's 151,936-row embedding (PR 2074, open).
* inv_freq: ``HFTransformerModel.init_states``
  (torchtitan/experiments/transformers_modeling_backend/model.py) recomputes a rotary
  module's ``inv_freq`` only through ``rope_init_fn``, which transformers 5.x rotary
  classes no longer have, so after the meta build and ``to_empty()`` the buffer keeps
  whatever memory it got (issue 4783, fix PR 4817, both open; the issue measured 11.08
  instead of 3.63 for Qwen3-0.6B). It is non-persistent: the checkpoint load cannot fix it.

RoPE theta, the third suspect, is not a defect of config 1 (the backend reads 5e6 from
config.json); config 2's "4B" flavor builds 1e6, so the last test runs config 2 both ways.
Attention stays the recipe's causal SDPA in every lane: upstream's FlexAttention with its
causal BlockMask computes the same attention, so it is not a lane.

Cost: every lane's reference is a full fp32 forward of 64 × 2048 tokens through the 4B model
on the host CPU, and each measured suspect one more (``python -m harness.reference cost``
measures it per row and layer on the machine at hand).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from pathlib import Path

import pytest

from harness import reference
from harness.published import CLAIMS
from recipes.tiers import TRN2
from requires import requires_dataset, requires_neuron_device, requires_qwen3_4b_weights, requires_torch_neuronx

MODEL_DIR = Path(os.environ.get("QWEN3_4B_DIR", "QWEN3_4B_DIR-is-not-set"))
NPROC = 64
#: The published claim, and how close a lane must come to count as reproducing it
#: (fixtures/goldens/hf_backend/trn2.json states the same 0.02 for the published lane).
PUBLISHED = CLAIMS["step1_loss_hf"].value
PUBLISHED_ATOL = 0.02
#: A launch (cold NEFF compile) plus the host reference and up to two suspects at 4B size.
LANE_TIMEOUT_S = TRN2.launch_timeout_s + 3 * 3600

pytestmark = [
    requires_neuron_device,
    requires_torch_neuronx,
    requires_qwen3_4b_weights,
    requires_dataset,
    pytest.mark.timeout(LANE_TIMEOUT_S),
]

#: lane -> (the tutorial's tokenizer?, upstream's inv_freq?)
LANES = {
    "as_published": (True, True),
    "tokenizer_fixed": (False, True),
    "inv_freq_fixed": (True, False),
    "corrected": (False, False),
}


def torchtitan_test_tokenizer() -> Path:
    """The tutorial's effective ``hf_assets_path``: ``./tests/assets/tokenizer`` of the TorchTitan checkout.

    TorchTitan Neuron installs with ``pip install -e .`` from its git checkout
    (scripts/neuron_venv.sh), so the package's parent directory is the checkout.
    """
    import torchtitan

    path = Path(torchtitan.__file__).resolve().parents[1] / "tests" / "assets" / "tokenizer"
    if not (path / "tokenizer.json").is_file():
        pytest.fail(
            f"{path}/tokenizer.json is missing: the tutorial's default hf_assets_path is torchtitan's "
            "./tests/assets/tokenizer; install TorchTitan Neuron from its checkout (make neuron-venv)",
            pytrace=False,
        )
    return path


@contextlib.contextmanager
def kept_defects(names: list[str]):
    """``QWEN3_HF_KEEP_DEFECTS`` for one launch (recipes.hf_as_published); every rank inherits it."""
    before = os.environ.get("QWEN3_HF_KEEP_DEFECTS")
    os.environ["QWEN3_HF_KEEP_DEFECTS"] = ",".join(names)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("QWEN3_HF_KEEP_DEFECTS", None)
        else:
            os.environ["QWEN3_HF_KEEP_DEFECTS"] = before


@functools.cache
def reference_model():
    """Qwen3-4B-Instruct-2507 in fp32 on the host (~16 GiB), loaded once for every lane."""
    return reference.load_reference_model(MODEL_DIR)


def run_lane(shared_dir: Path, name: str, **options) -> tuple[dict, reference.ReferenceCheck]:
    """One step of config 1 on 64 ranks, then the reference on its recorded batch (always diagnosed).

    A run that stops in step 1 (torchtitan raises on a non-finite loss before logging it, which
    uninitialised RoPE memory can cause) still recorded its batch: it is measured as NaN.
    """
    from harness.launch import LaunchError, launch
    from harness.options import RunOptions
    from harness.preflight import preflight

    opts = preflight(RunOptions(run_dir=shared_dir / name, tier="trn2", nproc=NPROC, steps=1, seed=0, export=False,
                                init="hf", model_dir=MODEL_DIR, **options))  # fmt: skip
    try:
        result = launch(opts, echo=lambda line: None).to_dict()
    except LaunchError as e:
        if e.result is None or reference.load_record(opts.run_dir) is None:
            raise
        result = {**e.result.to_dict(), "error": e.summary}
    check = reference.check_run_dir(opts.run_dir, always_diagnose=True, allow_no_step=True, model=reference_model())
    return result, check


def record_lane(record_property, lane: str, result: dict, check: reference.ReferenceCheck) -> None:
    record_property(f"trn2.{lane}.provenance", result.get("provenance"))
    record_property(f"trn2.{lane}.run_error", result.get("error"))
    record_property(f"trn2.{lane}.reference", check.to_dict())
    record_property(f"trn2.{lane}.measured_minus_published", check.measured - PUBLISHED)


@pytest.fixture(scope="module")
def lanes(shared_dir) -> dict:
    results = {}
    for lane, (test_tokenizer, upstream_inv_freq) in LANES.items():
        options = dict(recipe="hf_backend")
        if test_tokenizer:
            options.update(tokenizer_dir=torchtitan_test_tokenizer(), allow_mismatch=["tokenizer"])
        with kept_defects(["inv_freq"] if upstream_inv_freq else []):
            results[lane] = run_lane(shared_dir, f"trn2-config1-{lane}", **options)
    return results


@pytest.mark.parametrize("lane", list(LANES))
def test_each_lane_is_explained_by_the_reference(lane, lanes, record_property):
    """Each lane either agrees with what the weights score, or its diagnosis names exactly the defects it kept."""
    result, check = lanes[lane]
    record_lane(record_property, lane, result, check)
    test_tokenizer, upstream_inv_freq = LANES[lane]
    kept = {name for name, on in (("tokenizer", test_tokenizer), ("inv_freq", upstream_inv_freq)) if on}
    assert check.kept_defects == (["inv_freq"] if upstream_inv_freq else []), check.kept_defects
    if not kept:
        assert check.passed, reference.summary(check)
        assert check.named == [], check.diagnosis()
        return
    applies = {s.name for s in check.suspects if s.applies}
    assert kept <= applies, f"{lane}: kept {sorted(kept)}, diagnosis saw {sorted(applies)}: {check.diagnosis()}"
    assert kept <= set(check.named) or check.passed, reference.summary(check)


def test_the_published_6_54_is_reproduced_and_explained_or_shown_not_to_be_what_the_weights_score(
    lanes, record_property
):
    """Side by side: every lane's measured loss, its reference, and 6.54."""
    table = {
        lane: {"measured": check.measured, "reference": check.reference, "named": check.named, "passed": check.passed}
        for lane, (_, check) in lanes.items()
    }
    record_property("trn2.config1.lanes", table)
    corrected = lanes["corrected"][1]
    reproducing = [lane for lane, row in table.items() if abs(row["measured"] - PUBLISHED) <= PUBLISHED_ATOL]
    record_property("trn2.config1.lanes_reproducing_6_54", reproducing)
    record_property("trn2.config1.weights_score", corrected.reference)
    # The corrected lane is what the weights score on this batch, within the bf16 allowance.
    assert corrected.passed, reference.summary(corrected)
    for lane in reproducing:
        check = lanes[lane][1]
        # 6.54 reproduced: either the weights really score it, or the lane's defects are named.
        assert check.passed or check.named, f"{lane} reproduces {PUBLISHED} without an explanation: {check.diagnosis()}"
    if not reproducing:
        # No lane gives 6.54: it is not what the weights score here (the corrected reference says what is).
        assert abs(corrected.reference - PUBLISHED) > corrected.tolerance, table
    assert all(math.isfinite(row["reference"]) for row in table.values()), table


def test_config2_theta_as_published_and_corrected(shared_dir, record_property):
    """Config 2's "4B" flavor (theta 1e6) vs config.json's 5e6 on the same weights and batch."""
    runs = {
        "as_published": run_lane(shared_dir, "trn2-config2-theta-1e6", recipe="native_qwen3", allow_mismatch=["rope_theta"]),
        "corrected": run_lane(shared_dir, "trn2-config2-theta-config", recipe="native_qwen3", rope_theta=5e6),
    }
    for lane, (result, check) in runs.items():
        record_lane(record_property, f"config2.{lane}", result, check)
    published, corrected = runs["as_published"][1], runs["corrected"][1]
    (theta,) = [s for s in published.suspects if s.name == "rope_theta"]
    assert theta.applies, published.diagnosis()
    # The as-published run computes what the weights score at the flavor's theta.
    assert theta.reference_with_fault == pytest.approx(published.measured, abs=published.tolerance)
    assert corrected.passed, reference.summary(corrected)
