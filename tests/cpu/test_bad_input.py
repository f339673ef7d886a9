"""Bad input stops before any rank starts: one message naming the value and the fix, exit 2, nothing written.

Most cases call ``python -m harness``'s ``main`` in this process: the same code and the same checks,
without a fresh interpreter importing torch and torchtitan (~2.5 s of CPU, 8-12 s of wall under a
full ``make test``) for every case. In process the cpu tier starts its ranks "exec", so ``main``
prestarts no harness.launch.elastic (its prestart and its cancel on a refusal are
tests/cpu/test_rank_start.py's claim): the in-process cases start no process at all.

Four cases run the real command line (``fresh_process=True``, the cpu tier as it ships, its
elastic prestarted), each refusal at another stage, so the command line is seen to behave like
``main``: its exit code 2, one stderr line, no traceback, nothing written and no process of the run
left (watched from before the start):

- ``test_unknown_recipe``: the earliest refusal (the recipe's name, before any file is read);
- ``test_report_dir_that_is_a_file``: a refusal of a directory the run writes, the file left as it was;
- ``test_runs_dir_inside_the_report_dir_that_is_a_file``: the report dir exists and holds nothing new;
- ``test_tokenizer_moved_by_a_torchtitan_option``: the latest refusal, of the built config after
  torchtitan's parser ran (its logger's own lines on the real stderr are seen and filtered).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recipes.tiers import FIXTURES, REPO_ROOT
from harness_main import main_in_process
from run_watch import RunWatch, describe


FIXTURE_DIR = FIXTURES / "qwen3-tiny"


def run_main(*args: str, report_dir, fresh_process: bool = False) -> tuple[subprocess.CompletedProcess, float]:
    """``python -m harness run ARGS --report-dir DIR``: its exit code, stdout and stderr, and how long it took.

    ``fresh_process``: the real command line, and no process of the run (its prestarted
    harness.launch.elastic, its forkserver) may be left once it has exited.
    """
    argv = ["run", *args, "--report-dir", str(report_dir)]
    started = time.perf_counter()
    if fresh_process:
        with RunWatch(report_dir) as watch:
            out = subprocess.run(
                [sys.executable, "-m", "harness", *argv], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
            )
        elapsed = time.perf_counter() - started
        left = watch.kill_left()
        watch.saw(launcher=1)  # the watch finds the run's processes: "none left" is not a blind finder's
        assert left == [], f"a refused `python -m harness run` left {describe(left)} ({watch.summary()})"
        return out, elapsed
    return main_in_process(argv), time.perf_counter() - started


def assert_refused(out: subprocess.CompletedProcess, elapsed: float, report_dir, *fragments: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    error_lines = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1, out.stderr
    for fragment in fragments:
        assert fragment in error_lines[0], (fragment, error_lines[0])
    assert not report_dir.exists(), "a refused run must write nothing"
    assert elapsed < 60, f"refusal took {elapsed:.0f} s"


def test_missing_model_dir(tmp_path):
    missing = tmp_path / "no-such-model"
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(missing), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(missing), "does not exist")


def test_model_dir_without_safetensors(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(FIXTURE_DIR / "config.json", model / "config.json")
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(model), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(model), "safetensors")


def test_model_dir_without_config(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(FIXTURE_DIR / "model.safetensors", model / "model.safetensors")
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(model), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(model), "config.json")


def test_config_sizes_that_disagree_with_the_recipe(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(FIXTURE_DIR, model)
    config = json.loads((model / "config.json").read_text())
    config["hidden_size"] = 256
    (model / "config.json").write_text(json.dumps(config))
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(model), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", "hidden_size", "256", "128", "config.json")


def test_export_dir_equal_to_source_dir(tmp_path):
    out, elapsed = run_main(
        "native_qwen3", "--init", "hf", "--model-dir", str(FIXTURE_DIR), "--export-dir", str(FIXTURE_DIR),
        report_dir=tmp_path / "r",
    )
    assert_refused(out, elapsed, tmp_path / "r", "--export-dir", "never written")


def test_unknown_recipe(tmp_path):
    out, elapsed = run_main("qwen9_native", report_dir=tmp_path / "r", fresh_process=True)
    assert_refused(out, elapsed, tmp_path / "r", "qwen9_native", "native_qwen3")


def test_unknown_tier(tmp_path):
    out, elapsed = run_main("native_qwen3", "--tier", "tpu", report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", "'tpu'", "cpu, trn2")


def test_trn2_tier_without_a_neuron_device(tmp_path):
    out, elapsed = run_main("native_qwen3", "--tier", "trn2", report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", "--tier trn2", "no Neuron device", "--tier cpu")


def copy_fixture(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(FIXTURE_DIR, model)
    return model


def test_truncated_safetensors(tmp_path):
    model = copy_fixture(tmp_path)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(model), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(weights), "truncated")


def test_corrupt_safetensors_header(tmp_path):
    model = copy_fixture(tmp_path)
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:40] = b"\xff" * 32
    weights.write_bytes(bytes(data))
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(model), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(weights), "corrupt safetensors header")


def test_checkpoint_tensor_with_the_wrong_shape_names_key_and_both_shapes(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    model = copy_fixture(tmp_path)
    weights = model / "model.safetensors"
    state = load_file(weights)
    state["model.layers.0.mlp.up_proj.weight"] = torch.zeros(100, 128)
    save_file(state, weights)
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(model), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", "'model.layers.0.mlp.up_proj.weight'", "[100, 128]", "[384, 128]")


def test_checkpoint_missing_a_tensor_names_it(tmp_path):
    from safetensors.torch import load_file, save_file

    model = copy_fixture(tmp_path)
    weights = model / "model.safetensors"
    state = load_file(weights)
    del state["model.norm.weight"]
    save_file(state, weights)
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(model), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", "'model.norm.weight'", "[128]")


def test_tokenizer_missing_from_model_dir(tmp_path):
    model = copy_fixture(tmp_path)
    (model / "tokenizer.json").unlink()
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--model-dir", str(model), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(model / "tokenizer.json"), "does not exist")


def test_dataset_dir_that_does_not_exist(tmp_path):
    missing = tmp_path / "no-corpus"
    out, elapsed = run_main("native_qwen3", "--dataset-dir", str(missing), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(missing), "does not exist")


@pytest.mark.parametrize("content, fragment", [("", "holds no text"), ('{"url": "x"}\n', 'no non-empty "text"')])
def test_dataset_without_text(tmp_path, content, fragment):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.jsonl").write_text(content)
    out, elapsed = run_main("native_qwen3", "--dataset-dir", str(corpus), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(corpus / "train.jsonl"), fragment)


def test_non_empty_export_dir_is_refused_without_overwrite(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "keep.txt").write_text("a previous export")
    out, elapsed = run_main("native_qwen3", "--init", "hf", "--export-dir", str(export), report_dir=tmp_path / "r")
    assert_refused(out, elapsed, tmp_path / "r", str(export), "--overwrite")
    assert (export / "keep.txt").read_text() == "a previous export"


# --- every file a run reads and every directory it writes -----------------------------------------------
#
# One bad input per case, built in tmp_path from the fixtures, through ``python -m harness run`` (``main``
# in process, or the real command line where the case says ``fresh_process=True``): exit 2, ONE stderr line
# naming the path, the problem and the fix, and no rank started (launch prints "N process(es), run dir ..."
# and writes run.json under the report dir before torchrun: neither).

LAUNCH_LINE = "process(es), run dir"
ERROR_PREFIX = "python -m harness run: error: "
#: --steps 1 and --init hf (no full-width random-init run is added): a check that fails to refuse costs one short run.
PLAIN = ("native_qwen3", "--init", "hf", "--steps", "1")
HF = (*PLAIN, "--model-dir")


def assert_one_line_refusal(out, elapsed, path, problem, fix, noise=()) -> str:
    """Exit 2 before launch, stderr one error line holding ``path``, ``problem`` and ``fix``; returns it."""
    assert out.returncode == 2, (out.returncode, out.stdout[-2000:], out.stderr[-4000:])
    assert "Traceback" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip() and not line.startswith(tuple(noise))]
    assert len(lines) == 1 and lines[0].startswith(ERROR_PREFIX), out.stderr
    for fragment in (str(path), problem, fix):
        assert fragment in lines[0], (fragment, lines[0])
    assert LAUNCH_LINE not in out.stdout and "[rank" not in out.stderr, out.stdout
    assert elapsed < 60, f"refusal took {elapsed:.0f} s"
    return lines[0]


def refused(tmp_path, record_property, args, path, problem, fix, report_dir=None, noise=(), fresh_process=False):
    report_dir = report_dir or tmp_path / "report"
    out, elapsed = run_main(*args, report_dir=report_dir, fresh_process=fresh_process)
    record_property("refusal_s", round(elapsed, 2))
    line = assert_one_line_refusal(out, elapsed, path, problem, fix, noise)
    if not report_dir.is_file():  # a --report-dir that is a file: its test checks the file is untouched
        assert not report_dir.exists(), f"a refused run wrote {sorted(report_dir.rglob('*'))}"
    return line


def edit_config(model, **changes):
    """Change keys of ``model``'s config.json (None deletes one)."""
    path = model / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        config.pop(key) if value is None else config.__setitem__(key, value)
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("recipe, model_type, fix", [
    ("native_qwen3", "llama", "point --model-dir at a Qwen3ForCausalLM checkpoint"),
    ("native_qwen3", "qwen3_moe", "or run recipe hf_backend on it"),
    ("hf_backend", "llama", "point --model-dir at a Qwen3ForCausalLM or Qwen3MoeForCausalLM checkpoint"),
])  # fmt: skip
def test_config_of_another_model_type(tmp_path, record_property, recipe, model_type, fix):
    """Seen failing: trained as dense Qwen3, scored on the host against the model config.json names:
    "reference ... Δ -0.879" (llama, both recipes), "Δ -6.38" (qwen3_moe), exit 1."""
    config = edit_config(model := copy_fixture(tmp_path), model_type=model_type)
    args = (recipe, *HF[1:], str(model))
    refused(tmp_path, record_property, args, config, f"model_type is {model_type!r}", fix)


def test_hf_backend_reads_config_json_with_random_init_too(tmp_path):
    """The HF backend builds what config.json says with any --init (in process: a subprocess would add
    the full-width random-init run to the plan, ~100 s, should the check ever stop refusing)."""
    from harness.options import RunOptions
    from harness.checks import PreflightError, preflight

    model = copy_fixture(tmp_path)
    edit_config(model, model_type="llama")
    with pytest.raises(PreflightError, match="model_type is 'llama'"):
        preflight(RunOptions(recipe="hf_backend", init="random", model_dir=model))


def test_architectures_that_disagree_with_model_type(tmp_path, record_property):
    """A dense model_type under a MoE architecture. Seen failing: ranks started and failed, then the
    launcher's report raised "KeyError: 'tokenizer'"; exit 1."""
    model = copy_fixture(tmp_path)
    config = edit_config(model, architectures=["Qwen3MoeForCausalLM"])
    args = ("hf_backend", "--init", "hf", "--steps", "1", "--model-dir", str(model))
    refused(tmp_path, record_property, args, config, "disagree with model_type 'qwen3'", "re-copy config.json")


@pytest.mark.parametrize("key", ["hidden_size", "vocab_size", "head_dim", "tie_word_embeddings", "rope_theta"])
def test_config_without_a_key_the_model_is_built_from(tmp_path, record_property, key):
    """Seen failing: the run trained, then the host reference raised "RuntimeError: You set
    `ignore_mismatched_sizes` to `False`" (sizes: transformers' defaults) or, without tie_word_embeddings
    or RoPE theta, gave a reference mismatch with every known suspect "ruled out"; exit 1."""
    change = {"rope_parameters": {"rope_type": "default"}} if key == "rope_theta" else {key: None}
    config = edit_config(model := copy_fixture(tmp_path), **change)
    named = "rope_theta or rope_parameters.rope_theta" if key == "rope_theta" else key
    refused(tmp_path, record_property, (*HF, str(model)), config, f"has no {named}", "re-copy config.json")


def test_config_size_given_as_a_string(tmp_path, record_property):
    """Seen failing: refused with the wrong fix "accept with --allow-mismatch hidden_size"."""
    model = copy_fixture(tmp_path)
    config = edit_config(model, hidden_size="128")
    line = refused(tmp_path, record_property, (*HF, str(model)), config, "hidden_size is '128', not a positive integer",
                   "re-copy config.json")  # fmt: skip
    assert "--allow-mismatch" not in line


@pytest.mark.parametrize("text, problem", [('{"model_type": "qwen3",', "is not valid JSON"), ("[1, 2]", "holds a JSON list")])
def test_config_that_is_not_a_json_object(tmp_path, record_property, text, problem):
    model = copy_fixture(tmp_path)
    (model / "config.json").write_text(text)
    refused(tmp_path, record_property, (*HF, str(model)), model / "config.json", problem, "re-copy config.json")


def test_truncated_tokenizer_json(tmp_path, record_property):
    """Seen failing: "Exception: EOF while parsing a value at line 1717 column 0" traceback (provenance), exit 1."""
    model = copy_fixture(tmp_path)
    tokenizer = model / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes()[: tokenizer.stat().st_size // 2])
    refused(tmp_path, record_property, (*HF, str(model)), tokenizer, "EOF while parsing", "re-copy tokenizer.json")


@pytest.mark.parametrize("change, problem", [
    (lambda text: text[:-40], "is not valid JSON"),
    (lambda text: json.dumps({**json.loads(text), "eos_token": 5}), "eos_token is 5"),
])  # fmt: skip
def test_invalid_tokenizer_config(tmp_path, record_property, change, problem):
    """Seen failing: ranks started and raised in torchtitan's tokenizer ("[rank1]: json.decoder.JSONDecodeError"),
    then the launcher's report raised "KeyError: 'tokenizer'"; exit 1."""
    model = copy_fixture(tmp_path)
    path = model / "tokenizer_config.json"
    path.write_text(change(path.read_text()))
    refused(tmp_path, record_property, (*HF, str(model)), path, problem, "re-copy")


@pytest.mark.slow
def test_tokenizer_moved_by_a_torchtitan_option(tmp_path, record_property):
    """``--hf_assets_path`` reaches the config after the run's own paths are checked.

    Seen failing: rank 0 raised "Exception: EOF while parsing ..." in torchtitan's tokenizer, exit 1.
    """
    tokenizer_dir = copy_fixture(tmp_path)
    tokenizer = tokenizer_dir / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes()[:1000])
    args = ("native_qwen3", "--init", "hf", "--hf_assets_path", str(tokenizer_dir))
    # torchtitan's expected warnings are filtered while the launcher checks (harness.config.EXPECTED_WARNINGS):
    # the refusal is the only stderr line.
    refused(tmp_path, record_property, args, tokenizer, "not a tokenizer", "re-copy tokenizer.json",
            fresh_process=True)  # fmt: skip


def shard_fixture(tmp_path, names=("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")):
    """The fixture's weights split into two shards with their index, as the Hub ships large models."""
    from safetensors.torch import load_file, save_file

    model = copy_fixture(tmp_path)
    state = load_file(model / "model.safetensors")
    (model / "model.safetensors").unlink()
    keys = sorted(state)
    weight_map = {}
    for name, part in zip(names, (keys[: len(keys) // 2], keys[len(keys) // 2 :])):
        save_file({k: state[k] for k in part}, model / name)
        weight_map.update(dict.fromkeys(part, name))
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return model


def test_sharded_weights_with_their_index_pass(tmp_path):
    """The control of the index cases below: the same shards, all present, are accepted."""
    from harness.checks.inputs import check_weights

    headers = check_weights(shard_fixture(tmp_path))
    assert sorted(headers) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert sum(map(len, headers.values())) == 24  # every tensor of the 2-layer fixture, tied head dropped


def test_index_naming_a_missing_shard(tmp_path, record_property):
    """Seen failing: refused as "has no tensor 'model.layers.1...' ... point --model-dir at weights of this
    model", naming neither the index nor the missing shard."""
    model = shard_fixture(tmp_path)
    (model / "model-00002-of-00002.safetensors").unlink()
    refused(tmp_path, record_property, (*HF, str(model)), model / "model.safetensors.index.json",
            "names shard model-00002-of-00002.safetensors", "copy the missing shard")  # fmt: skip


def test_shard_names_without_a_number(tmp_path, record_property):
    """torchtitan numbers shards by their names. Seen failing: "AttributeError: 'NoneType' object has no
    attribute 'group'" traceback (torchtitan's StateDictAdapter), exit 1."""
    model = shard_fixture(tmp_path, names=("first.safetensors", "second.safetensors"))
    refused(tmp_path, record_property, (*HF, str(model)), model / "model.safetensors.index.json",
            "holds no number", "rename the shard")  # fmt: skip


def test_shards_without_their_index(tmp_path, record_property):
    """Seen failing: trained, then the host reference was "not computed" (transformers found no
    model.safetensors), exit 1."""
    model = shard_fixture(tmp_path)
    (model / "model.safetensors.index.json").unlink()
    refused(tmp_path, record_property, (*HF, str(model)), model, "neither model.safetensors nor",
            "restore the model.safetensors.index.json")  # fmt: skip


def test_truncated_safetensors_header(tmp_path, record_property):
    model = copy_fixture(tmp_path)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # inside the JSON header
    refused(tmp_path, record_property, (*HF, str(model)), weights, "corrupt safetensors header", "re-download")


def test_model_dir_that_is_a_file(tmp_path, record_property):
    """Seen failing: "does not exist or is not a directory", no fix."""
    weights = FIXTURE_DIR / "model.safetensors"
    refused(tmp_path, record_property, (*HF, str(weights)), weights, "is a file, not a directory",
            "point it at a Hugging Face model directory")  # fmt: skip


def test_empty_dataset_dir(tmp_path, record_property):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    args = (*PLAIN, "--dataset-dir", str(corpus))
    refused(tmp_path, record_property, args, corpus, "holds no *.jsonl or *.json data files", "put the corpus there")


def test_dataset_dir_that_is_a_file(tmp_path, record_property):
    """Seen failing: refused with "does not exist" for a file that exists."""
    data = FIXTURES / "corpus" / "train.jsonl"
    args = (*PLAIN, "--dataset-dir", str(data))
    refused(tmp_path, record_property, args, data, "is a file, not a directory", f"(e.g. {data.parent})")


def test_jsonl_without_text_through_the_cli(tmp_path, record_property):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.jsonl").write_text('{"url": "x"}\n')
    args = (*PLAIN, "--dataset-dir", str(corpus))
    refused(tmp_path, record_property, args, corpus / "train.jsonl", 'no non-empty "text"', '{"text": "..."}')


def test_dataset_dir_where_datasets_would_read_other_files(tmp_path, record_property):
    """datasets reads the most common extension only. Seen failing: trained on the two .txt lines, the
    jsonl unread, and the verdict was a reference mismatch; exit 1."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(FIXTURES / "corpus" / "train.jsonl", corpus / "corpus.jsonl")  # no split name: all files are "train"
    (corpus / "notes.txt").write_text("a note\n")
    (corpus / "todo.txt").write_text("a list\n")
    args = (*PLAIN, "--dataset-dir", str(corpus))
    refused(tmp_path, record_property, args, corpus, "as text files (notes.txt, todo.txt)", "move those files out")


def test_dataset_dir_without_a_train_split(tmp_path, record_property):
    """A file named test.jsonl is datasets' test split. Seen failing: ranks started and failed, then the
    launcher's report raised "KeyError: 'tokenizer'"; exit 1."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(FIXTURES / "corpus" / "train.jsonl", corpus / "test.jsonl")
    args = (*PLAIN, "--dataset-dir", str(corpus))
    refused(tmp_path, record_property, args, corpus, "finds no train split", "e.g. to train.jsonl")


def test_report_dir_that_is_a_file(tmp_path, record_property):
    """Seen failing: "NotADirectoryError: [Errno 20] Not a directory: '.../runs/...'" traceback, exit 1."""
    report = tmp_path / "report.txt"
    report.write_text("not a directory")
    refused(tmp_path, record_property, PLAIN, report, "is a file, not a directory",
            "pass a --report-dir that is a writable directory", report_dir=report, fresh_process=True)  # fmt: skip
    assert report.read_text() == "not a directory"


@pytest.mark.slow
def test_runs_dir_inside_the_report_dir_that_is_a_file(tmp_path, record_property):
    """Seen failing: a NotADirectoryError traceback, exit 1."""
    report = tmp_path / "report"
    report.mkdir()
    (report / "runs").write_text("")
    out, elapsed = run_main(*PLAIN, report_dir=report, fresh_process=True)
    record_property("refusal_s", round(elapsed, 2))
    assert_one_line_refusal(out, elapsed, report / "runs", "is a file, not a directory",
                            "pass a --report-dir")  # fmt: skip
    assert sorted(p.name for p in report.iterdir()) == ["runs"] and (report / "runs").read_text() == ""


def unwritable_dir(tmp_path):
    """A directory this process cannot write: mode 0555 as a user; as root (which ignores modes), /proc/sys."""
    import os

    if os.geteuid() != 0:
        path = tmp_path / "read-only"
        path.mkdir(mode=0o555)
        return path
    path = Path("/proc/sys")
    if os.access(path, os.W_OK):
        pytest.skip("running as root on a host whose /proc/sys is writable: no unwritable directory to test with")
    return path


def test_report_dir_that_is_not_writable(tmp_path, record_property):
    """Seen failing: a FileNotFoundError traceback from mkdir, exit 1."""
    parent = unwritable_dir(tmp_path)
    report = parent / "report"
    refused(tmp_path, record_property, PLAIN, parent, "not writable",
            "pass a --report-dir that is a writable directory", report_dir=report)  # fmt: skip


@pytest.mark.parametrize("kind", ["file", "unwritable"])
def test_export_dir_that_cannot_be_written(tmp_path, record_property, kind):
    """Seen failing: refused without a fix ("exists and is not a directory"); unwritable: trained, then
    the export failed on rank 0, exit 1."""
    if kind == "file":
        export = named = tmp_path / "export.txt"
        export.write_text("")
        problem = "is a file, not a directory"
    else:
        named = unwritable_dir(tmp_path)
        export, problem = named / "export", "not writable"
    args = (*PLAIN, "--export-dir", str(export))
    refused(tmp_path, record_property, args, named, problem, "pass an --export-dir that is a writable directory")
