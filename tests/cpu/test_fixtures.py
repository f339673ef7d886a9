"""Claims about fixtures/: the tokenizer, the corpus and the tiny checkpoints are what the
recipes assume, load offline with transformers and torchtitan, and rebuild bit for bit."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer

from fixtures import build_fixtures as bf

FIXTURES = bf.FIXTURES_DIR
REPO_ROOT = FIXTURES.parent
TOKENIZER_DIRS = ["tokenizer", "qwen3-tiny", "qwen3-moe-tiny"]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _record(model_dir: str) -> dict:
    return json.loads((FIXTURES / model_dir / "TRAINING.json").read_text())


def _safetensors_keys(model_dir: str) -> set[str]:
    with safe_open(FIXTURES / model_dir / "model.safetensors", "pt") as f:
        return set(f.keys())


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return bf.read_corpus(FIXTURES / "corpus")


@pytest.fixture(scope="module")
def packed(corpus) -> torch.Tensor:
    tokenizer = Tokenizer.from_file(str(FIXTURES / "tokenizer" / "tokenizer.json"))
    return bf.pack_sequences(tokenizer, corpus)


def _load(model_dir: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(FIXTURES / model_dir, dtype=torch.float32).eval()


def test_corpus_is_generated_and_cc0(corpus):
    assert 1500 <= len(corpus) <= 3000
    assert 300_000 <= (FIXTURES / "corpus" / "train.jsonl").stat().st_size <= 600_000
    assert "CC0" in (FIXTURES / "corpus" / "LICENSE").read_text()


@pytest.mark.parametrize("tokenizer_dir", TOKENIZER_DIRS)
def test_tokenizer_loads_in_transformers_and_torchtitan(tokenizer_dir, corpus):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from transformers import AutoTokenizer

    path = FIXTURES / tokenizer_dir
    hf = AutoTokenizer.from_pretrained(path)
    tt = HuggingFaceTokenizer(tokenizer_path=str(path))

    eos_id = tt.token_to_id(bf.EOS_TOKEN)
    assert len(hf) == tt.get_vocab_size() == bf.VOCAB_SIZE
    assert (hf.eos_token, hf.eos_token_id, hf.pad_token_id, hf.bos_token) == (
        bf.EOS_TOKEN,
        eos_id,
        eos_id,
        None,
    )
    assert (tt.eos_id, tt.bos_id) == (eos_id, None)

    line = corpus[0]
    ids = hf(line)["input_ids"]
    assert tt.encode(line) == ids
    # What torchtitan's text loader asks for: no BOS exists, so only eos is appended.
    assert tt.encode(line, add_bos=True, add_eos=True) == ids + [eos_id]
    assert hf.decode(ids) == tt.decode(ids) == line


@pytest.mark.parametrize("model_dir", ["qwen3-tiny", "qwen3-moe-tiny"])
def test_checkpoint_ships_the_same_tokenizer(model_dir):
    for name in bf.TOKENIZER_FILES:
        assert _sha256(FIXTURES / model_dir / name) == _sha256(FIXTURES / "tokenizer" / name)


def test_dense_checkpoint_matches_tiny_dense_tier():
    from transformers import AutoConfig

    from recipes.tiers import TINY_DENSE

    config = AutoConfig.from_pretrained(FIXTURES / "qwen3-tiny")
    for field in fields(TINY_DENSE):
        expected = getattr(TINY_DENSE, field.name)
        actual = (
            config.rope_parameters["rope_theta"]
            if field.name == "rope_theta"
            else getattr(config, field.name)
        )
        assert actual == expected, field.name
    assert config.eos_token_id == config.pad_token_id == 0 and config.bos_token_id is None


def test_dense_checkpoint_is_tied_on_disk_and_after_loading():
    keys = _safetensors_keys("qwen3-tiny")
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys
    model = _load("qwen3-tiny")
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_moe_checkpoint_stores_experts_per_expert():
    keys = _safetensors_keys("qwen3-moe-tiny")
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= keys
    experts = {k for k in keys if ".mlp.experts." in k}
    assert experts == {
        f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"
        for layer in range(2)
        for e in range(8)
        for proj in ("gate_proj", "up_proj", "down_proj")
    }
    model = _load("qwen3-moe-tiny")
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    assert (model.config.num_experts, model.config.num_experts_per_tok) == (8, 2)
    # In memory transformers 5 fuses them: [experts, 2 * moe_intermediate, hidden].
    assert tuple(model.model.layers[0].mlp.experts.gate_up_proj.shape) == (8, 128, 128)


@pytest.mark.parametrize("model_dir", ["qwen3-tiny", "qwen3-moe-tiny"])
def test_checkpoint_eval_loss_matches_record(model_dir, packed):
    record = _record(model_dir)
    assert _sha256(FIXTURES / model_dir / "model.safetensors") == record["model_safetensors_sha256"]
    with torch.no_grad():
        loss = bf.causal_lm_loss(
            _load(model_dir), packed[: record["train"]["eval_sequences"]]
        ).item()
    assert loss < 4.0 < math.log(bf.VOCAB_SIZE)
    assert loss == pytest.approx(record["eval_loss"], abs=1e-4)


def test_corpus_and_tokenizer_rebuild_bitwise(tmp_path):
    bf.build_corpus_and_tokenizer(tmp_path)
    for rel in [
        "corpus/train.jsonl",
        "corpus/LICENSE",
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
    ]:
        assert _sha256(tmp_path / rel) == _sha256(FIXTURES / rel), rel


#: How far the rebuilt checkpoint's eval loss may sit from the recorded one on another machine.
#: Measured: 4.0e-5 between the shipped build (AVX512) and an AMD EPYC AVX2 rebuild, while the
#: same build from init seed 2 instead of 1 moves it by 7.9e-3 (1.01629 vs 1.00833): 1e-3 keeps
#: 25x the machine drift and still catches a build that is not the one that shipped.
EVAL_LOSS_TOLERANCE = 1e-3


def _rebuild_dense(outs: list[Path]) -> None:
    """Retrain qwen3-tiny into each of ``outs`` in fresh processes, side by side (one thread each)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fixtures.build_fixtures",
                "--out",
                str(out),
                "--models",
                "dense",
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for out in outs
    ]
    for proc in procs:
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"fixture rebuild failed:\n{output[-3000:]}"


def _differing_files(a: Path, b: Path) -> list[str]:
    names = sorted({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()})
    return [
        n
        for n in names
        if not (a / n).exists() or not (b / n).exists() or _sha256(a / n) != _sha256(b / n)
    ]


@pytest.mark.slow
def test_dense_checkpoint_rebuilds_deterministically(tmp_path, record_property):
    """~45 s per rebuild. The build is bitwise reproducible here, and it is what shipped.

    Bits transfer only within one environment (versions, CPU model, ISA, BLAS build,
    kernel-selecting env): there the rebuild must equal the shipped checkpoint byte for
    byte. Elsewhere two rebuilds must equal each other, and the shipped checkpoint's
    recorded eval loss must be reproduced within EVAL_LOSS_TOLERANCE.
    """
    record = _record("qwen3-tiny")
    here = bf.build_environment()
    same_environment = record["environment"] == here
    record_property("fixture_build_environment_recorded", record["environment"])
    record_property("fixture_build_environment_here", here)
    record_property("fixture_build_same_environment", same_environment)

    outs = [tmp_path / "a"] if same_environment else [tmp_path / "a", tmp_path / "b"]
    _rebuild_dense(outs)
    rebuilt = outs[0] / "qwen3-tiny"
    reference = FIXTURES / "qwen3-tiny" if same_environment else outs[1] / "qwen3-tiny"
    differing = _differing_files(rebuilt, reference)
    record_property("fixture_rebuild_differing_files", differing)
    assert not differing, f"rebuild is not bitwise identical to {reference}: {differing}"

    eval_loss = json.loads((rebuilt / "TRAINING.json").read_text())["eval_loss"]
    record_property("fixture_rebuild_eval_loss", eval_loss)
    record_property("fixture_rebuild_eval_loss_diff", eval_loss - record["eval_loss"])
    assert eval_loss == pytest.approx(record["eval_loss"], abs=EVAL_LOSS_TOLERANCE), (
        f"rebuilt qwen3-tiny scores {eval_loss:.6f} on its eval rows, the shipped one recorded "
        f"{record['eval_loss']:.6f}: fixtures/build_fixtures.py no longer builds what shipped "
        "(`make fixtures` rebuilds it; then `make goldens`)"
    )
