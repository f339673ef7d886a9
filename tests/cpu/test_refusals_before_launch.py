"""Issue 35, points 5-7: bad inputs a user gives ``python -m harness run`` (cpu tier), each refused before launch.

One row per case: how to build its inputs in tmp_path (from the fixtures, with the real safetensors
library), the command line and environment, and the one stderr line it must end in (exit 2, naming the
file, key, value and fix). Every row runs ``main`` in this process (tests/cpu/harness_main.py), except
the three ``$QWEN3_RANK_START`` rows, which are about what a fresh interpreter does at import. Each row
also asserts that no rank started, nothing was written under the report dir, and that the sha256 of
every input file (the row's own and the fixtures) is the same after the refusal as before.

What each case did before this module (seen on the cpu tier, commit 327d3b6) is its ``today``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from harness_main import main_in_process
from recipes.tiers import FIXTURES, REPO_ROOT
from test_bad_input import FIXTURE_DIR, HF, PLAIN, assert_one_line_refusal, edit_config, run_main, shard_fixture

#: Nothing may stand beside the refusal (torchtitan's expected warnings are filtered: harness.config.EXPECTED_WARNINGS).
NOISE = ()
CORPUS = FIXTURES / "corpus" / "train.jsonl"


# --- inputs, built in tmp_path/in ------------------------------------------------------------------------


def model(root: Path, **config) -> Path:
    """The fixture checkpoint copied to ``root/model``, its config.json changed by ``config``."""
    path = root / "model"
    shutil.copytree(FIXTURE_DIR, path)
    if config:
        edit_config(path, **config)
    return path


def int8_weights(root: Path) -> Path:
    """The fixture's tensors rewritten as int8 (a quantized checkpoint's dtype), shapes unchanged."""
    import torch
    from safetensors.torch import load_file, save_file

    path = model(root)
    state = load_file(path / "model.safetensors")
    save_file({k: (v * 100).to(torch.int8) for k, v in state.items()}, path / "model.safetensors")
    return path


def unlisted_shard(root: Path) -> Path:
    """Two shards and their index, plus a third *.safetensors the index does not name."""
    from safetensors.torch import load_file, save_file

    path = shard_fixture(root)
    part = load_file(path / "model-00002-of-00002.safetensors")
    key = sorted(part)[0]
    save_file({key: part[key]}, path / "model-00003-of-00003.safetensors")
    return path


def corpus(root: Path, data: bytes) -> Path:
    path = root / "corpus"
    path.mkdir()
    (path / "train.jsonl").write_bytes(data)
    return path


def truncated_tokenizer(root: Path) -> Path:
    path = model(root)
    tokenizer = path / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes()[:1000])
    return path


@dataclass(frozen=True)
class Case:
    """One bad input: ``args`` after ``run`` ({model}, {data}, {path} name what ``build`` made)."""

    id: str
    args: tuple[str, ...]
    #: Each must be in the one error line; formatted like ``args``.
    fragments: tuple[str, ...]
    #: What the case did before (commit 327d3b6), cpu tier.
    today: str
    build: Callable[[Path], Path] | None = None
    env: dict[str, str] = field(default_factory=dict)
    #: Run from the inputs' directory (relative paths), else from the repository root.
    from_inputs: bool = False
    #: The whole argv (no ``run`` prefix) and the error line's prefix.
    command: bool = False
    prefix: str = "python -m harness run: error: "


BOM = b"\xef\xbb\xbf"
CASES = [
    # 5: model directories whose config.json, weights or index disagree
    Case("config-head-dim-and-heads-not-the-weights'", (*HF, "{model}"),
         ("{model}/config.json", "head_dim is 16", "hold 32", "q_norm.weight", "re-copy config.json"),
         "refused with the wrong fix: 'accept with --allow-mismatch num_attention_heads --allow-mismatch head_dim'",
         build=lambda root: model(root, num_attention_heads=8, head_dim=16)),
    Case("hf-backend-heads-not-the-weights'", ("hf_backend", *HF[1:], "{model}"),
         ("{model}/config.json", "num_attention_heads is 8", "hold 4", "q_proj.weight", "re-copy config.json"),
         "ranks started and failed loading the weights; exit 1", build=lambda root: model(root, num_attention_heads=8)),
    Case("hf-backend-intermediate-size-not-the-weights'", ("hf_backend", *HF[1:], "{model}"),
         ("{model}/config.json", "intermediate_size is 256", "hold 384", "gate_proj.weight", "re-copy config.json"),
         "ranks started and failed loading the weights; exit 1",
         build=lambda root: model(root, intermediate_size=256)),
    Case("hf-backend-hidden-size-not-the-weights'", ("hf_backend", *HF[1:], "{model}"),
         ("{model}/config.json", "hidden_size is 256", "hold 128", "embed_tokens.weight", "re-copy config.json"),
         "ranks started and failed loading the weights; exit 1", build=lambda root: model(root, hidden_size=256)),
    Case("integer-weights", (*HF, "{model}"),
         ("{model}/model.safetensors", "is I8, not floating point", "unquantized float weights"),
         "trained on the int8 values cast to float: step-1 loss 30186, 'agrees with the reference'; exit 1",
         build=int8_weights),
    Case("safetensors-the-index-does-not-list", (*HF, "{model}"),
         ("{model}/model-00003-of-00003.safetensors", "is not named by model.safetensors.index.json",
          "move it out of the model directory"),
         "refused as now (kept here: the issue lists it)", build=unlisted_shard),
    Case("rms-norm-eps-differs", (*HF, "{model}"),
         ("rms_norm_eps: {model}/config.json says 1e-05", "builds RMSNorm eps 1e-06", "--allow-mismatch rms_norm_eps"),
         "trained; the reference check failed (Δ -2.08e-05) with 'none of the known suspects accounts for it'",
         build=lambda root: model(root, rms_norm_eps=1e-5)),
    Case("rope-scaling-differs", (*HF, "{model}"),
         ("RoPE scaling: {model}/config.json says rope_type 'yarn'", "builds 'default' RoPE",
          "--allow-mismatch rope_scaling"),
         "trained; the reference check failed (Δ +0.00126), misnamed 'inv_freq ... as left by to_empty()'",
         build=lambda root: model(root, rope_parameters={"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0,
                                                         "original_max_position_embeddings": 1024})),  # fmt: skip
    # 6: data, sizes, parallelism, rendezvous
    Case("dataset-smaller-than-one-record-per-rank", (*PLAIN, "--dataset-dir", "{data}"),
         ("--dataset-dir {data} holds 1 record(s)", "2 data-parallel rank(s)", "add records (at least 2)"),
         "ranks started; rank 1 'IndexError: Index 1 out of range for dataset of size 1', then the report's "
         "KeyError: 'tokenizer' traceback; exit 1", build=lambda root: corpus(root, b'{"text": "hi"}\n')),
    Case("dataset-utf8-with-bom", (*PLAIN, "--dataset-dir", "{data}"),
         ("{data}/train.jsonl is UTF-8 text with a byte-order mark", "save it as UTF-8 without a byte-order mark",
          "utf-8-sig"),
         "ranks started; pyarrow 'ValueError: Expected object or value', then the report's KeyError traceback; exit 1",
         build=lambda root: corpus(root, BOM + CORPUS.read_bytes())),
    Case("dataset-utf16", (*PLAIN, "--dataset-dir", "{data}"),
         ("{data}/train.jsonl is UTF-16 text", "save it as UTF-8", "read_text('utf-16')"),
         "refused naming 'not UTF-8 (byte 300 of the line)', no encoding, no fix but the JSON-lines format",
         build=lambda root: corpus(root, CORPUS.read_text().encode("utf-16"))),
    Case("dataset-latin1", (*PLAIN, "--dataset-dir", "{data}"),
         ("{data}/train.jsonl:2: not UTF-8", "Latin-1", "save the file as UTF-8"),
         "refused naming 'not UTF-8 (byte N of the line)' with the JSON-lines format as the only fix",
         build=lambda root: corpus(root, '{"text": "plain"}\n{"text": "caf\u00e9 cr\u00e8me"}\n'.encode("latin-1"))),
    Case("local-batch-size-0", (*PLAIN, "--training.local_batch_size", "0"),
         ("--training.local_batch_size 0 is not a positive integer", "pass a positive --training.local_batch_size"),
         "ranks started and failed (AssertionError), then the report's KeyError: 'tokenizer' traceback; exit 1"),
    Case("tensor-parallel-not-dividing-the-world", (*PLAIN, "--parallelism.tensor_parallel_degree", "3"),
         ("--parallelism.tensor_parallel_degree 3 does not divide the 2 rank(s)", "choose a divisor of 2"),
         "ranks started and failed (AssertionError), then the report's KeyError: 'tokenizer' traceback; exit 1"),
    Case("tensor-parallel-not-dividing-the-heads",
         (*PLAIN, "--nproc", "4", "--parallelism.tensor_parallel_degree", "4"),
         ("--parallelism.tensor_parallel_degree 4 does not divide the model's 4 attention heads and 2 key/value heads",
          "choose a common divisor"),
         "not tried at 4 ranks on 2 cores; torchtitan asserts it on every rank"),
    Case("rdzv-endpoint-without-a-port", (*PLAIN, "--rdzv-endpoint", "localhost"),
         ("--rdzv-endpoint 'localhost' is not HOST:PORT", "e.g. --rdzv-endpoint 10.0.0.1:29500"),
         "ignored: trained standalone, exit 0"),
    Case("rdzv-endpoint-port-not-a-number", (*PLAIN, "--nnodes", "2", "--rdzv-endpoint", "localhost:abc"),
         ("--rdzv-endpoint 'localhost:abc' is not HOST:PORT", "a port 1-65535"),
         "torchrun started and failed, then the report's KeyError: 'tokenizer' traceback; exit 1"),
    # 7: no silent change
    Case("layers-beyond-the-native-model", ("native_qwen3", "--init", "random", "--steps", "1", "--layers", "99"),
         ("--layers 99 is more than the 36 layers of the model recipe 'native_qwen3' builds (4B)", "choose --layers 1..36"),
         "clamped: trained 36 layers (spec.model.layers[:99])"),
    Case("layers-beyond-the-hf-backend-config", ("hf_backend", "--init", "hf", "--steps", "1", "--layers", "5"),
         ("--layers 5 is more than the 2 layers of", "qwen3-tiny/config.json", "choose --layers 1..2"),
         "refused with the wrong fix: 'accept with --allow-mismatch num_hidden_layers'"),
    Case("layers-on-a-recipe-that-builds-its-own", ("nki_moe", "--init", "random", "--steps", "1", "--layers", "2"),
         ("recipe 'nki_moe' builds its own 4 layers and does not take --layers (got 2)", "drop --layers"),
         "ignored: trained 4 layers"),
    # refusals the product once held (recipes/tutorial.py check_compile, the kernels' fixes): now harness/checks
    Case("rope-hf-seq-len-not-a-multiple-of-128-x-lnc",
         ("native_qwen3", "--init", "random", "--steps", "1", "--override", "rope_hf", "--seq-len", "200"),
         ("seq_len=200 is not a multiple of 128×LNC=256 (LNC=2); use 256.", "set training.seq_len to a multiple of 256"),
         "refused by recipes/kernels/rope.py check_seq_len, the same line"),
    Case("compile-backend-not-the-tiers", (*PLAIN, "--compile.enable", "--compile.backend", "neuron"),
         ("compile.enable with compile.backend='neuron' cannot compile for --tier cpu: use --compile.backend inductor",
          "or drop --compile.enable"),
         "refused by recipes/tutorial.py check_compile, the same line"),
    Case("trn2-dataset-env-on-the-cpu-tier", PLAIN,
         ("QWEN3_DATASET_DIR={data} is set", "reads QWEN3_DATASET_DIR on trn2 only", "--dataset-dir {data}"),
         "ignored: trained on fixtures/corpus, exit 0",
         build=lambda root: corpus(root, CORPUS.read_bytes()), env={"QWEN3_DATASET_DIR": "{data}"}),
    Case("steps-not-a-number", ("native_qwen3", "--steps", "abc"),
         ("--steps takes {{None}}|INT, not 'abc'", "see python -m harness run --help"),
         "tyro's 14-line error box; exit 2"),
    Case("dry-run-as-a-command", ("dry-run",),
         ("unknown command 'dry-run'", "choose one of list, run, history", "python -m harness run RECIPE --dry-run"),
         "the usage text, no error line; exit 2", command=True, prefix="python -m harness: error: "),
    Case("relative-torchtitan-path-from-the-current-directory", (*PLAIN, "--hf_assets_path", "model"),
         ("{model}/tokenizer.json", "not a tokenizer", "re-copy tokenizer.json"),
         "read from the repository root: refused as '<repo>/model does not exist' for a directory that exists",
         build=truncated_tokenizer, from_inputs=True),
    Case("relative-model-dir-from-the-current-directory", (*HF, "model"),
         ("{model}/config.json", "head_dim is 16"),
         "resolved from the current directory (kept as the control of the row above)",
         build=lambda root: model(root, num_attention_heads=8, head_dim=16), from_inputs=True),
]  # fmt: skip


def digests(*roots: Path) -> dict[str, str]:
    """sha256 of every file under ``roots``."""
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for root in roots
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused_in_one_line_before_launch(case, tmp_path, monkeypatch, record_property):
    inputs = tmp_path / "in"
    inputs.mkdir()
    built = case.build(inputs) if case.build else None
    names = {"model": built, "data": built, "path": built}
    for key, value in case.env.items():
        monkeypatch.setenv(key, value.format(**names))
    if case.from_inputs:
        monkeypatch.chdir(inputs)
    report = tmp_path / "report"
    args = [a.format(**names) for a in case.args]
    argv = args if case.command else ["run", *args, "--report-dir", str(report)]
    watched = (inputs, FIXTURE_DIR, FIXTURES / "corpus")
    before = digests(*watched)
    import time

    started = time.perf_counter()
    out = main_in_process(argv)
    elapsed = time.perf_counter() - started
    record_property("refusal_s", round(elapsed, 2))
    line = assert_one_line_refusal(out, elapsed, "", "", "", noise=NOISE) if case.prefix.endswith("run: error: ") \
        else _one_line(out, case.prefix)  # fmt: skip
    for fragment in case.fragments:
        assert fragment.format(**names) in line, (fragment.format(**names), line)
    assert not report.exists(), f"a refused run wrote {sorted(report.rglob('*'))}"
    assert digests(*watched) == before, "a refused run changed an input file"


def _one_line(out: subprocess.CompletedProcess, prefix: str) -> str:
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(prefix) and "Traceback" not in out.stderr, out.stderr
    return lines[0]


@pytest.mark.slow
def test_a_refusal_of_the_built_config_is_the_only_line_on_the_real_command_line(tmp_path, record_property):
    """In a fresh interpreter torchtitan's root logger prints its warnings to stderr (under pytest its log
    capture takes them, so the in-process rows cannot see them). Today: 'initial_load_model_only=True has no
    effect without an initial_load_path.' stood above every refusal of the built config."""
    report = tmp_path / "report"
    out, elapsed = run_main(*PLAIN, "--training.local_batch_size", "0", report_dir=report, fresh_process=True)
    record_property("refusal_s", round(elapsed, 2))
    assert_one_line_refusal(out, elapsed, "--training.local_batch_size 0", "is not a positive integer",
                            "pass a positive --training.local_batch_size")  # fmt: skip
    assert not report.exists()


# --- $QWEN3_RANK_START: read when recipes.tiers is imported, so a fresh interpreter per row -------------------


@pytest.mark.parametrize("argv, code", [
    pytest.param(["list"], 0, id="list", marks=pytest.mark.slow),  # ~10 s: `list` imports the overrides (torch)
    pytest.param(["--help"], 0, id="help"),
    pytest.param(["run", "--help"], 0, id="run-help"),
    pytest.param([*PLAIN], 2, id="run", marks=pytest.mark.slow),
])  # fmt: skip
def test_a_bad_rank_start_is_refused_when_used_only(argv, code, tmp_path):
    """Today: every command, `list` and `--help` included, ended in a 15-line ValueError traceback at import."""
    report = tmp_path / "report"
    full = ["run", *argv, "--report-dir", str(report)] if argv == [*PLAIN] else argv
    env = {**os.environ, "QWEN3_RANK_START": "bogus"}
    before = digests(FIXTURE_DIR, FIXTURES / "corpus")
    out = subprocess.run([sys.executable, "-m", "harness", *full], capture_output=True, text=True, cwd=REPO_ROOT,
                         env=env, timeout=120)  # fmt: skip
    assert out.returncode == code and "Traceback" not in out.stderr, (out.returncode, out.stderr[-3000:])
    if code == 0:
        assert out.stdout.strip() and not out.stderr.strip(), out.stderr
        return
    line = _one_line(out, "python -m harness run: error: ")
    assert "QWEN3_RANK_START='bogus'" in line and "use one of exec, preloaded, or unset it" in line, line
    assert not report.exists()
    assert digests(FIXTURE_DIR, FIXTURES / "corpus") == before


# --- goldens: never "accept" a golden for a run on other inputs ------------------------------------------------


@pytest.mark.parametrize("where", ["model_dir", "dataset_dir", "tokenizer_dir"])
def test_a_run_on_other_inputs_is_not_judged_against_the_tiers_golden(where, tmp_path):
    """A golden's "stale golden" advice (`make goldens ACCEPT=1`) is for a code change on its own inputs.

    Today: a run on a copy of the fixture with config.json's rms_norm_eps changed (allowed) was judged
    against `step1_loss_hf`, whose stale-golden message advises accepting the run's value.
    """
    from harness.options import RunOptions
    from harness.verdicts import golden_key

    own = RunOptions(recipe="native_qwen3", init="hf").resolved()
    assert golden_key(own) == "step1_loss_hf"  # the control: the tier's own inputs are judged
    copy = model(tmp_path) if where != "dataset_dir" else corpus(tmp_path, CORPUS.read_bytes())
    other = RunOptions(recipe="native_qwen3", init="hf", **{where: copy}).resolved()
    assert golden_key(other) is None


# --- --nnodes 2 with no second node: a launch (this one case is about launching) ----------------------------


@pytest.mark.slow
def test_a_node_whose_peers_never_come_says_so_while_waiting_and_ends_at_the_rendezvous_timeout(tmp_path):
    """Today: nothing printed after the launch line for torch's default 600 s join timeout, then the report's
    KeyError: 'tokenizer' traceback. Now: a line every 15 s while waiting, and one ``why`` naming the rendezvous."""
    import socket
    import time

    from harness.checks import preflight
    from harness.launch import LaunchError, launch
    from harness.options import RunOptions
    from run_watch import RunWatch, describe

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{s.getsockname()[1]}"
    timeout_s = 20
    opts = preflight(RunOptions(recipe="native_qwen3", init="random", nproc=1, steps=1, export=False, nnodes=2,
                                rdzv_endpoint=endpoint, rdzv_timeout=timeout_s, run_dir=tmp_path / "node0"))  # fmt: skip
    lines: list[str] = []
    started = time.perf_counter()
    with RunWatch(tmp_path) as watch, pytest.raises(LaunchError) as failed:
        launch(opts, echo=lines.append)
    elapsed = time.perf_counter() - started
    left = watch.kill_left()
    watch.saw(torchrun=1)  # the watch saw the node's torchrun wait: "none left" is not a blind finder's
    assert left == [], f"left {describe(left)}"
    waiting = [line for line in lines if "waiting" in line]
    assert waiting and f"for all 2 nodes to join the rendezvous at {endpoint}" in waiting[0], lines
    assert failed.value.summary.startswith(f"the rendezvous at {endpoint} did not gather --nnodes 2 nodes within "
                                           f"--rdzv-timeout {timeout_s} s, so no rank started"), failed.value.summary  # fmt: skip
    assert "\n" not in failed.value.summary
    assert timeout_s <= elapsed < timeout_s + 45, f"the wait took {elapsed:.0f} s for --rdzv-timeout {timeout_s}"
