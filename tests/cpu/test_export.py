"""The ``last_save_in_hf`` export round trip: transformers reads back exactly what torchtitan trained."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from harness.declare.published import CLAIMS
from recipes.tiers import FIXTURES

FIXTURE_DIR = FIXTURES / "qwen3-tiny"


#: What the fixture checkpoint holds; a run that wrote into it would add or change files.
SOURCE_FILES = (
    "TRAINING.json",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


@pytest.fixture(scope="module")
def export_dir(native_hf_run) -> Path:
    return Path(native_hf_run["export_dir"])


@pytest.fixture(scope="module")
def export_state_dict(export_dir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = {}
    for path in sorted(export_dir.glob("*.safetensors")):
        state.update(load_file(path))
    return state


@pytest.fixture(scope="module")
def tokens(export_dir) -> torch.Tensor:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    text = "The train to the harbour leaves at seven, and the garden is quiet in the rain."
    return torch.tensor([tokenizer(text)["input_ids"]])


def hf_model_from_state_dict(export_dir: Path, state: dict):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(export_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    result = model.load_state_dict(state, strict=False)
    return model, result


def test_export_loads_with_only_the_tied_head_missing(
    export_dir, export_state_dict, record_property
):
    model, result = hf_model_from_state_dict(export_dir, export_state_dict)
    record_property("export_missing_keys", sorted(result.missing_keys))
    record_property("export_unexpected_keys", sorted(result.unexpected_keys))
    assert sorted(result.unexpected_keys) == CLAIMS["export_unexpected_keys"].value
    assert sorted(result.missing_keys) == CLAIMS["export_missing_keys"].value
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, export_state_dict["model.embed_tokens.weight"])


def test_reloaded_logits_equal_torchtitan_logits(
    export_dir, export_state_dict, tokens, record_property
):
    """torchtitan's Qwen3 with the export loaded through its own adapter == transformers' logits."""
    from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter

    from recipes.native_qwen3 import model_spec

    hf_model, _ = hf_model_from_state_dict(export_dir, export_state_dict)
    spec = model_spec("cpu")
    titan = spec.model.build().eval()
    adapter = Qwen3StateDictAdapter(spec.model, hf_assets_path=str(export_dir))
    missing, unexpected = titan.load_state_dict(
        adapter.from_hf(dict(export_state_dict)), strict=False
    )
    assert not unexpected and not [
        k for k in missing if "lm_head" not in k and "output" not in k
    ], (missing, unexpected)
    with torch.no_grad():
        hf_logits = hf_model(tokens).logits
        titan_logits = titan(tokens)
    diff = (hf_logits - titan_logits).abs().max().item()
    record_property("export_logits_max_abs_diff", diff)
    assert diff == 0.0


#: tests/cpu/test_nki_moe.py's shared run of config 3 (the same name and options: launched once).
NKI_MOE_RUN = dict(recipe="nki_moe", tier="cpu", nproc=2, steps=4, init="random", seed=0)


@pytest.fixture(scope="module")
def nki_moe_run(recipe_run) -> dict:
    return recipe_run("nki-moe-2proc", **NKI_MOE_RUN)


@pytest.fixture(scope="module")
def nki_moe_initial_state(nki_moe_run, tmp_path_factory) -> dict[str, str]:
    """What config 3's ranks held before step 1 (random init: no source checkpoint), in the export's names.

    The run's options, built by the trainer in 2 new ranks and hashed after init
    (harness.rank.step1_forward --initial-state). That it is the run's own init is checked, not
    assumed: the same weights on the same first batch must score the run's step-1 loss.
    """
    from harness.base.run_dir import INITIAL_STATE_FILE
    from harness.judge import proxy
    from harness.options.run_options import RunOptions

    run_dir = tmp_path_factory.mktemp("nki-moe-initial")
    scored = proxy.run(RunOptions(run_dir=run_dir, **NKI_MOE_RUN), initial_state=True)
    assert scored["loss"] == nki_moe_run["losses"][0], (scored["loss"], nki_moe_run["losses"][0])
    return json.loads((run_dir / INITIAL_STATE_FILE).read_text())


def safetensors_hashes(directory: Path) -> dict[str, str]:
    """sha256 of every tensor in ``directory``'s safetensors files, by name (harness.rank.export.tensor_sha256)."""
    from safetensors import safe_open

    from harness.rank.export import tensor_sha256

    hashes = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            hashes.update({k: tensor_sha256(f.get_tensor(k)) for k in f.keys()})
    return hashes


#: Every recipe run that exports after >= 1 optimizer step: its shared run, and the weights it
#: started from (a source checkpoint, or for a random init the init itself).
EXPORTING_RUNS = {
    "native_qwen3": ("native_hf_run", FIXTURE_DIR),
    "hf_backend": ("hf_backend_hf_run", FIXTURE_DIR),
    "hf_backend-moe": ("hf_backend_moe_run", FIXTURES / "qwen3-moe-tiny"),
    "nki_moe": ("nki_moe_run", None),
}


@pytest.mark.parametrize("case", EXPORTING_RUNS)
@pytest.mark.slow
def test_export_holds_the_trained_weights(case, request, record_property):
    """Every exported tensor is bit for bit what rank 0 held after the last step, and training
    moved at least one away from the weights it started from (an export of those would fail)."""
    from harness.rank.export import EXPORT_DIR_NAME, FINAL_STATE_FILE

    run_fixture, source_dir = EXPORTING_RUNS[case]
    run = request.getfixturevalue(run_fixture)
    assert len(run["losses"]) >= 1, run["losses"]
    export_dir = Path(run["export_dir"] or Path(run["run_dir"]) / EXPORT_DIR_NAME)
    trained = json.loads((Path(run["run_dir"]) / FINAL_STATE_FILE).read_text())
    exported = safetensors_hashes(export_dir)
    source = (
        safetensors_hashes(source_dir)
        if source_dir
        else request.getfixturevalue("nki_moe_initial_state")
    )
    mismatched = sorted(k for k in exported if trained.get(k) != exported[k])
    moved = sorted(k for k in exported if source.get(k) != exported[k])
    record_property(f"{case}_export_tensors", len(exported))
    record_property(f"{case}_export_tensors_not_the_trained_state", mismatched)
    record_property(f"{case}_export_tensors_moved_from_start", len(moved))
    assert exported, f"no safetensors in {export_dir}"
    assert not mismatched, (
        f"{len(mismatched)} of {len(exported)} exported tensors are not the trained state: {mismatched[:5]}"
    )
    assert set(exported) <= set(trained), sorted(set(exported) - set(trained))
    assert set(exported) <= set(source), (
        f"names the starting weights lack: {sorted(set(exported) - set(source))}"
    )
    assert moved, (
        "every exported tensor equals the weights the run started from: the export is not of the trained model"
    )


def test_export_opens_directly_with_from_pretrained(export_dir, tokens):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(export_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    assert tokenizer.vocab_size <= model.config.vocab_size
    with torch.no_grad():
        assert torch.isfinite(model(tokens).logits).all()


def test_source_model_dir_is_never_written(native_hf_run):
    from recipes.tiers import FIXTURES

    source = FIXTURES / "qwen3-tiny"
    recorded = json.loads((source / "TRAINING.json").read_text())
    digest = hashlib.sha256((source / "model.safetensors").read_bytes()).hexdigest()
    assert digest == recorded["model_safetensors_sha256"]
    assert sorted(p.name for p in source.iterdir()) == sorted(SOURCE_FILES)
