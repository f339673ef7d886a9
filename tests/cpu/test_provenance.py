"""Provenance: each run records what decided its step-1 loss, and refuses inputs that disagree."""

from __future__ import annotations

import json
import random
import shutil

import pytest

from harness.checks.mismatch import MismatchError, mismatches
from harness.checks.preflight import preflight
from harness.config.build import build_config, checked_config
from harness.config.provenance import dataset_info
from harness.options.run_options import RunOptions
from recipes.tiers import FIXTURES

FIXTURE_DIR = FIXTURES / "qwen3-tiny"
BASELINE = dict(recipe="native_qwen3", tier="cpu", nproc=1, steps=3, init="hf", seed=7)


def build(**options):
    """The config as the launcher checks it: every refusal before launch, then the build (harness.config.build.checked_config)."""
    return checked_config(RunOptions(**options))[1]


def permuted_tokenizer(directory):
    """The fixture tokenizer with its token ids shuffled: same vocabulary size, different tokenizer."""
    directory.mkdir()
    data = json.loads((FIXTURE_DIR / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    specials = {t["content"] for t in data["added_tokens"]}
    ids = [i for t, i in vocab.items() if t not in specials]
    shuffled = ids[:]
    random.Random(0).shuffle(shuffled)
    remap = dict(zip(ids, shuffled))
    data["model"]["vocab"] = {t: remap.get(i, i) for t, i in vocab.items()}
    (directory / "tokenizer.json").write_text(json.dumps(data))
    shutil.copy(FIXTURE_DIR / "tokenizer_config.json", directory / "tokenizer_config.json")
    return directory


@pytest.mark.parametrize(
    "recipe, options",
    [
        ("native_qwen3", dict(init="hf")),
        ("native_qwen3", dict(init="random")),
        ("hf_backend", dict(init="hf")),
        ("nki_moe", dict(init="random")),
    ],
)
def test_checks_are_silent_on_the_fixtures_as_shipped(recipe, options):
    opts = preflight(RunOptions(recipe=recipe, tier="cpu", **options))
    assert mismatches(opts, build_config(opts)) == []


def test_tokenizer_not_from_the_weights_dir_is_refused():
    with pytest.raises(
        MismatchError,
        match=r"weights come from .*qwen3-tiny but the tokenizer from .*--allow-mismatch tokenizer",
    ):
        build(init="hf", tokenizer_dir=FIXTURES / "tokenizer")


def test_tokenizer_larger_than_the_embedding_is_refused(tmp_path):
    big = tmp_path / "big"
    big.mkdir()
    data = json.loads((FIXTURE_DIR / "tokenizer.json").read_text())
    data["model"]["vocab"].update({f"extra{i}": 1024 + i for i in range(100)})
    (big / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(
        MismatchError, match="has 1124 tokens, more than the model's 1024 embedding rows"
    ):
        build(init="random", tokenizer_dir=big)


def test_rope_theta_differing_from_config_json_is_refused():
    with pytest.raises(
        MismatchError,
        match=r"rope_theta: .*config.json says 1000000.0, recipe 'native_qwen3' builds 10000.0",
    ):
        build(init="hf", rope_theta=10000.0)


def test_seq_len_above_max_position_embeddings_is_refused(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(FIXTURE_DIR, model)
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = 128
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(MismatchError, match="seq_len 256 is above max_position_embeddings 128"):
        build(init="hf", model_dir=model)


def test_allowed_mismatch_is_a_warning_the_provenance_repeats(capsys):
    from harness.config import provenance

    opts, config = checked_config(
        RunOptions(init="hf", rope_theta=10000.0, allow_mismatch=["rope_theta"])
    )
    assert "warning: allowed mismatch rope_theta" in capsys.readouterr().err
    allowed = [m for m in mismatches(opts, config) if m.name in opts.allow_mismatch]
    record = provenance.provenance(opts, config, allowed)
    assert record["model"]["rope_theta"] == 10000.0
    assert record["allowed_mismatches"] and "rope_theta" in record["allowed_mismatches"][0]


def test_provenance_fields_of_a_real_run(recipe_run):
    run = recipe_run("native-determinism-1", **BASELINE)
    record = run["provenance"]
    assert (
        record["tokenizer"]["path"] == str(FIXTURE_DIR)
        and record["tokenizer"]["vocab_size"] == 1024
    )
    assert len(record["tokenizer"]["sha256"]) == 64
    assert record["weights"]["path"] == str(FIXTURE_DIR) and record["weights"]["files"] == [
        "model.safetensors"
    ]
    assert record["model"] == {
        "vocab_size": 1024,
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rope_theta": 1e6,
        "max_seq_len": 256,
        "tie_word_embeddings": True,
    }
    corpus = FIXTURES / "corpus" / "train.jsonl"
    assert record["data"] == {
        "path": str(FIXTURES / "corpus"),
        "seq_len": 256,
        "local_batch_size": 2,
        "global_batch_size": 2,
        "files": [{"name": "train.jsonl", "bytes": corpus.stat().st_size}],
        # the corpus as this process hashes it (the content rule: tests/cpu/test_dataset_provenance.py)
        "sha256": dataset_info(FIXTURES / "corpus")["sha256"],
    }
    assert record["seed"] == 7 and record["dtype"] == {"params": "float32", "export": "float32"}
    assert record["allowed_mismatches"] == []


@pytest.mark.parametrize("recipe, init", [("hf_backend", "hf"), ("nki_moe", "random")])
def test_provenance_fields_for_the_other_recipes(recipe, init):
    from harness.config import provenance

    opts = preflight(RunOptions(recipe=recipe, tier="cpu", init=init))
    record = provenance.provenance(opts, build_config(opts))
    assert record["tokenizer"]["vocab_size"] == 1024
    assert record["model"]["vocab_size"] == 1024 and record["model"]["rope_theta"] == 1e6
    assert (record["weights"] is None) == (init == "random")
    assert record["data"]["seq_len"] == 256


@pytest.mark.slow
def test_wrong_tokenizer_and_wrong_rope_theta_raise_the_step1_loss(
    recipe_run, tmp_path_factory, record_property
):
    """What the checks protect against, measured: both mismatches make the same weights score worse."""
    own = recipe_run("native-determinism-1", **BASELINE)["losses"][0]
    tokenizer = permuted_tokenizer(tmp_path_factory.mktemp("tok") / "permuted")
    wrong_tokenizer = recipe_run(
        "native-wrong-tokenizer",
        **{**BASELINE, "steps": 1},
        tokenizer_dir=tokenizer,
        allow_mismatch=["tokenizer"],
    )["losses"][0]
    wrong_theta = recipe_run(
        "native-wrong-rope-theta",
        **{**BASELINE, "steps": 1},
        rope_theta=10000.0,
        allow_mismatch=["rope_theta"],
    )["losses"][0]
    record_property("step1_loss_own_tokenizer_and_theta", own)
    record_property("step1_loss_permuted_tokenizer", wrong_tokenizer)
    record_property("step1_loss_rope_theta_1e4", wrong_theta)
    # A scrambled vocabulary makes the trained weights worse than uniform guessing (ln 1024 = 6.93).
    assert wrong_tokenizer > own + 4.0
    # theta 1e4 instead of 1e6 rotates the low-frequency pairs 100x faster: attention no longer
    # lines up with what the model was trained on. Measured +0.117 on the pinned lock; 0.05 keeps
    # a clear effect while leaving room for a kernel change in a lock bump.
    assert wrong_theta > own + 0.05
