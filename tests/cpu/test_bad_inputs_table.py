"""Issue 35's table: every bad input and interrupt a user may give ``python -m harness run``, one row each.

A row (``Row``) is (input, stage, exit code, one-line message) and is run here: its inputs are
built in tmp_path from the fixtures (tests/cpu/bad_inputs.py), ``main`` runs in this process
(``bad_inputs.in_process``: the same checks as the command line, no interpreter per row, and the
stage it stopped at: "options" is the parser, "checks" the checks of ``cmd_run``), and the row
asserts the exit code, the one stderr line holding every fragment, no traceback, no launch line, and
that the sha256 of every input (the row's own, fixtures/, the paths it guards, and the report
directory a previous run left) is the same after as before. Rows about the command line itself
(``fresh``) run the real ``python -m harness``, as the user does.

The report directory of every row already holds a previous run's report (one whose ranks died
before provenance.json: the issue's poisoner) and must be byte-identical afterwards, so whatever a
later run does with it is what it would have done without the refusal; the slow
``test_after_the_failing_rows_a_second_run_into_the_same_report_dir_succeeds`` runs every in-process
row into one report dir, then a run whose ranks die, then a real good run there.

Cases that are about launching (signals at each stage, a rendezvous that never gathers, two launches
in one second, torchtitan's own entry) keep their subprocess harness in their own module; ``ELSEWHERE``
names each with one row, and ``test_every_row_elsewhere_is_a_test_there`` checks each is a test there.
What each case did before its fix is its ``today`` (cpu tier, commits 327d3b6 and earlier).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import bad_inputs as b
import pytest
from bad_inputs import BOM, CORPUS, FIXTURE_DIR, HF, PLAIN

RUN_ERROR = "python -m harness run: error: "
STAGES = ("options", "checks", "rank start", "training", "reference", "report")


@dataclass(frozen=True)
class Row:
    """``args`` after ``run`` (``{model}``, ``{data}``, ``{tokenizer}``, ``{path}``, ``{in}``, ``{repo}``,
    ``{live}``: what ``build`` made, the inputs' folder, the repository, a run still going)."""

    id: str
    point: int
    args: tuple[str, ...]
    #: Each must be in the one stderr line (formatted like ``args``); none for a command that must work.
    message: tuple[str, ...]
    stage: str = "checks"
    code: int = 2
    build: Callable | None = None
    today: str = ""
    env: dict = field(default_factory=dict)
    #: Substrings the line must not hold (advice that would destroy an input, or the wrong fix).
    never: tuple[str, ...] = ()
    #: Paths besides the inputs, fixtures/ and the report whose sha256 must not change.
    guarded: tuple[str, ...] = ()
    #: Run from the inputs' folder (relative paths), else from the repository root.
    from_inputs: bool = False
    #: ``args`` is the whole argv (no ``run``, no ``--report-dir``).
    command: bool = False
    prefix: str = RUN_ERROR
    #: The real command line (a fresh interpreter); ``watch``: its prestarted launcher is seen, none left.
    fresh: bool = False
    watch: bool = True
    slow: bool = False


TO_INPUT = ("--overwrite",)
#: A run on ``b.copies`` of every input.
COPIES = ("native_qwen3", "--init", "hf", "--model-dir", "{model}", "--dataset-dir", "{data}")
CFG = "{model}/config.json"
ROWS = [
    # 2: nothing the user gave is deleted or overwritten (export and report targets), before launch
    Row(
        "export-dir-is-the-tokenizer-dir",
        2,
        (*COPIES, "--tokenizer-dir", "{tokenizer}", "--export-dir", "{tokenizer}", *TO_INPUT),
        ("--export-dir {tokenizer} is --tokenizer-dir {tokenizer}", "never deletes or overwrites"),
        build=b.copies,
    ),
    Row(
        "export-dir-contains-the-model-dir",
        2,
        (*COPIES, "--export-dir", "{in}", *TO_INPUT),
        (
            "--export-dir {in} contains --model-dir {model}",
            "choose an --export-dir outside every input",
        ),
        build=b.copies,
    ),
    Row(
        "export-dir-inside-the-dataset-dir",
        2,
        (*COPIES, "--export-dir", "{data}/export", *TO_INPUT),
        ("--export-dir {data}/export lies inside --dataset-dir {data}",),
        build=b.copies,
    ),
    Row(
        "export-dir-is-the-dataset-dir-no-overwrite",
        2,
        (*COPIES, "--export-dir", "{data}"),
        ("--export-dir {data} is --dataset-dir {data}",),
        build=b.copies,
        never=("--overwrite",),
    ),
    Row(
        "export-dir-is-fixtures",
        2,
        (*COPIES, "--export-dir", "{repo}/fixtures", *TO_INPUT),
        ("--export-dir {repo}/fixtures is the suite's fixtures/",),
        build=b.copies,
    ),
    Row(
        "export-dir-holds-tracked-files",
        2,
        (*COPIES, "--export-dir", "{repo}/harness", *TO_INPUT),
        ("--export-dir {repo}/harness contains", "tracked file(s) of the repository"),
        build=b.copies,
        guarded=("{repo}/harness",),
    ),
    Row(
        "export-dir-is-a-tracked-file",
        2,
        (*COPIES, "--export-dir", "{repo}/README.md", *TO_INPUT),
        ("--export-dir {repo}/README.md is the tracked file README.md",),
        build=b.copies,
        guarded=("{repo}/README.md",),
    ),
    Row(
        "export-dir-is-a-going-runs-dir",
        2,
        (*COPIES, "--export-dir", "{live}", *TO_INPUT),
        ("--export-dir {live} is the run directory {live} of a run still going (pid",),
        build=b.copies,
        guarded=("{live}",),
    ),
    Row(
        "export-dir-holds-a-going-runs-dir",
        2,
        (*COPIES, "--export-dir", "{live}/..", *TO_INPUT),
        ("contains the run directory {live} of a run still going",),
        build=b.copies,
        guarded=("{live}",),
    ),
    # issue 46 item 1: --overwrite replaces a previous export and nothing else, naming the file that says so
    Row(
        "overwrite-an-earlier-report-dir",
        2,
        (*PLAIN, "--export-dir", "{path}", *TO_INPUT),
        (
            "--export-dir {path} is a report directory",
            "{path}/.qwen3-repro.json",
            "--overwrite replaces only a previous export",
            "choose a new --export-dir",
        ),
        build=b.earlier_report,
        today="the report (results.json, results.md, runs/ with checkpoints and logs) deleted without a word",
    ),
    Row(
        "overwrite-an-unmarked-report-dir",
        2,
        (*PLAIN, "--export-dir", "{path}", *TO_INPUT),
        (
            "--export-dir {path} holds 3 file(s) the suite did not write",
            "{path}/results.json",
            "no {path}/.qwen3-repro.json",
            "--overwrite replaces only a previous export",
        ),
        build=b.unmarked_report,
        today="the report deleted without a word",
    ),
    Row(
        "overwrite-a-run-dir",
        2,
        (*PLAIN, "--export-dir", "{path}", *TO_INPUT),
        ("--export-dir {path} is a run directory", "{path}/.qwen3-repro.json"),
        build=b.earlier_run_dir,
        today="the run's checkpoints, steps and logs deleted without a word",
    ),
    Row(
        "overwrite-a-users-own-dir",
        2,
        (*PLAIN, "--export-dir", "{path}", *TO_INPUT),
        ("--export-dir {path} holds 1 file(s) the suite did not write", "{path}/thesis.tex"),
        build=b.foreign_dir,
        today="the user's directory deleted without a word",
    ),
    Row(
        "overwrite-an-export-holding-a-foreign-file",
        2,
        (*PLAIN, "--export-dir", "{path}", *TO_INPUT),
        (
            "--export-dir {path} holds 1 file(s) the suite did not write",
            "{path}/notes.txt",
            "not listed in {path}/.qwen3-repro.json",
        ),
        build=b.export_with_a_foreign_file,
        today="the previous export and the user's notes.txt in it deleted without a word",
    ),
    Row(
        "overwrite-the-export-dir-of-a-going-run",
        2,
        (*PLAIN, "--export-dir", "{live}/../../export", *TO_INPUT),
        (
            "is the --export-dir of a run still going (pid",
            "{live}/run.json",
            "wait for it to end",
        ),
        build=b.copies,
        guarded=("{live}",),
        today="trained, then published over the going run's export",
    ),
    # issue 46 item 2: every path an option names, resolved without a traceback
    *(
        Row(
            f"{flag[2:]}-{name}",
            2,
            (*PLAIN, flag, value),
            (f"{flag} {value} is {kind}", f"point {flag} at a directory"),
            stage="options",
            build=build,
            today=today,
        )
        for flag, name, value, kind, build, today in [
            (
                "--dataset-dir",
                "a-symlink-loop",
                "{path}",
                "a symlink loop",
                b.symlink_loop,
                "RuntimeError: Symlink loop traceback from Path.resolve(), exit 1",
            ),
            (
                "--report-dir",
                "a-symlink-loop",
                "{path}",
                "a symlink loop",
                b.symlink_loop,
                "RuntimeError: Symlink loop traceback from Path.resolve() in harness/__main__.py, exit 1",
            ),
            (
                "--hf_assets_path",
                "a-symlink-loop",
                "{path}",
                "a symlink loop",
                b.symlink_loop,
                "RuntimeError: Symlink loop traceback, exit 1",
            ),
            (
                "--dataset-dir",
                "a-fifo",
                "{path}",
                "a FIFO (named pipe)",
                b.fifo,
                "refused as 'is a file, not a directory'",
            ),
            (
                "--model-dir",
                "a-socket",
                "{path}",
                "a socket",
                b.unix_socket,
                "refused as 'is a file, not a directory'",
            ),
            (
                "--tokenizer-dir",
                "a-device",
                "/dev/null",
                "a character device",
                None,
                "refused as 'is a file, not a directory'",
            ),
        ]
    ),
    *(
        Row(
            f"{flag[2:]}-an-empty-string",
            2,
            (*PLAIN, flag, ""),
            (f"{flag} is given an empty path ''", f"pass {flag} a directory path"),
            stage="options",
            today=today,
        )
        for flag, today in [
            ("--report-dir", "wrote results.json, results.md and runs/ into the repository root"),
            ("--export-dir", "read as the current directory"),
        ]
    ),
    Row(
        "report-dir-inside-the-dataset-dir",
        2,
        (*COPIES, "--report-dir", "{data}/report"),
        (
            "the run directory {data}/report/runs/",
            "lies inside --dataset-dir {data}",
            "pass a --report-dir outside every input",
        ),
        build=b.copies,
    ),
    Row(
        "dump-folder-inside-fixtures",
        2,
        (*COPIES, "--dump_folder", "{repo}/fixtures/qwen3-tiny/run"),
        ("--dump_folder {repo}/fixtures/qwen3-tiny/run lies inside the suite's fixtures/",),
        build=b.copies,
    ),
    Row(
        "export-dir-is-the-source-model-dir",
        2,
        (*HF, str(FIXTURE_DIR), "--export-dir", str(FIXTURE_DIR)),
        ("--export-dir", "never written"),
    ),
    Row(
        "non-empty-export-dir-without-overwrite",
        2,
        (*PLAIN, "--export-dir", "{path}"),
        ("{path}", "--overwrite"),
        build=b.previous_export,
    ),
    Row(
        "export-dir-that-is-a-file",
        2,
        (*PLAIN, "--export-dir", "{path}"),
        (
            "{path}",
            "is a file, not a directory",
            "pass an --export-dir that is a writable directory",
        ),
        build=b.a_file("", "export.txt"),
        today="refused without a fix ('exists and is not a directory')",
    ),
    Row(
        "export-dir-not-writable",
        2,
        (*PLAIN, "--export-dir", "{path}/export"),
        ("{path}", "not writable", "pass an --export-dir that is a writable directory"),
        build=b.unwritable_dir,
        today="trained, then the export failed on rank 0, exit 1",
    ),
    Row(
        "report-dir-that-is-a-file",
        2,
        (*PLAIN, "--report-dir", "{path}"),
        (
            "{path}",
            "is a file, not a directory",
            "pass a --report-dir that is a writable directory",
        ),
        build=b.a_file(),
        fresh=True,
        today="NotADirectoryError traceback, exit 1",
    ),
    Row(
        "runs-dir-inside-the-report-dir-that-is-a-file",
        2,
        (*PLAIN, "--report-dir", "{path}"),
        ("{path}/runs", "is a file, not a directory", "pass a --report-dir"),
        build=b.report_with_a_runs_file,
        fresh=True,
        slow=True,
        today="NotADirectoryError traceback, exit 1",
    ),
    Row(
        "report-dir-not-writable",
        2,
        (*PLAIN, "--report-dir", "{path}/report"),
        ("{path}", "not writable", "pass a --report-dir that is a writable directory"),
        build=b.unwritable_dir,
        today="FileNotFoundError traceback from mkdir, exit 1",
    ),
    Row(
        "a-refused-plan-into-the-users-empty-dir",
        2,
        ("native_qwen3", "--steps", "0", "--report-dir", "{path}"),
        ("--steps must be a positive integer, got 0",),
        build=b.empty_dir,
        today="the report dir the user made was removed with the runs/ it claimed",
    ),
    # 5: a model dir whose config.json, weights or index disagree: before launch, the file, key, value and fix
    Row(
        "config-head-dim-and-heads-not-the-weights'",
        5,
        (*HF, "{model}"),
        (CFG, "head_dim is 16", "hold 32", "q_norm.weight", "re-copy config.json"),
        build=b.model(num_attention_heads=8, head_dim=16),
        today="refused with the wrong fix: 'accept with --allow-mismatch num_attention_heads --allow-mismatch head_dim'",
    ),
    Row(
        "hf-backend-heads-not-the-weights'",
        5,
        ("hf_backend", *HF[1:], "{model}"),
        (CFG, "num_attention_heads is 8", "hold 4", "q_proj.weight", "re-copy config.json"),
        build=b.model(num_attention_heads=8),
        today="ranks started and failed loading the weights; exit 1",
    ),
    Row(
        "hf-backend-intermediate-size-not-the-weights'",
        5,
        ("hf_backend", *HF[1:], "{model}"),
        (CFG, "intermediate_size is 256", "hold 384", "gate_proj.weight", "re-copy config.json"),
        build=b.model(intermediate_size=256),
        today="ranks started and failed loading the weights; exit 1",
    ),
    Row(
        "hf-backend-hidden-size-not-the-weights'",
        5,
        ("hf_backend", *HF[1:], "{model}"),
        (CFG, "hidden_size is 256", "hold 128", "embed_tokens.weight", "re-copy config.json"),
        build=b.model(hidden_size=256),
        today="ranks started and failed loading the weights; exit 1",
    ),
    Row(
        "native-hidden-size-not-the-recipes",
        5,
        (*HF, "{model}"),
        ("hidden_size", "256", "128", "config.json"),
        build=b.model(hidden_size=256),
    ),
    Row(
        "integer-weights",
        5,
        (*HF, "{model}"),
        ("{model}/model.safetensors", "is I8, not floating point", "unquantized float weights"),
        build=b.model_with(
            b.safetensors_edit(
                lambda s: {k: (v * 100).to(__import__("torch").int8) for k, v in s.items()}
            )
        ),
        today="trained on the int8 values cast to float: step-1 loss 30186, 'agrees with the reference'; exit 1",
    ),
    Row(
        "safetensors-the-index-does-not-list",
        5,
        (*HF, "{model}"),
        (
            "{model}/model-00003-of-00003.safetensors",
            "is not named by model.safetensors.index.json",
            "move it out of the model directory",
        ),
        build=b.shards(b.unlisted_shard),
    ),
    Row(
        "rms-norm-eps-differs",
        5,
        (*HF, "{model}"),
        (
            "rms_norm_eps: {model}/config.json says 1e-05",
            "builds RMSNorm eps 1e-06",
            "--allow-mismatch rms_norm_eps",
        ),
        build=b.model(rms_norm_eps=1e-5),
        today="trained; the reference check failed (Δ -2.08e-05) with 'none of the known suspects accounts for it'",
    ),
    Row(
        "rope-scaling-differs",
        5,
        (*HF, "{model}"),
        (
            "RoPE scaling: {model}/config.json says rope_type 'yarn'",
            "builds 'default' RoPE",
            "--allow-mismatch rope_scaling",
        ),
        build=b.model(
            rope_parameters={
                "rope_theta": 1e6,
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 1024,
            }
        ),
        today="trained; the reference check failed (Δ +0.00126), misnamed 'inv_freq ... as left by to_empty()'",
    ),
    Row(
        "missing-model-dir",
        5,
        (*HF, "{in}/no-such-model"),
        ("{in}/no-such-model", "does not exist"),
    ),
    Row(
        "model-dir-that-is-a-file",
        5,
        (*HF, str(FIXTURE_DIR / "model.safetensors")),
        (
            str(FIXTURE_DIR / "model.safetensors"),
            "is a file, not a directory",
            "point it at a Hugging Face model directory",
        ),
    ),
    Row(
        "model-dir-without-safetensors",
        5,
        (*HF, "{model}"),
        ("{model}", "safetensors"),
        build=b.only("config.json"),
    ),
    Row(
        "model-dir-without-config",
        5,
        (*HF, "{model}"),
        ("{model}", "config.json"),
        build=b.only("model.safetensors"),
    ),
    Row(
        "truncated-safetensors",
        5,
        (*HF, "{model}"),
        ("{model}/model.safetensors", "truncated"),
        build=b.model_with(b.cut("model.safetensors", lambda n: n // 2)),
    ),
    Row(
        "truncated-safetensors-header",
        5,
        (*HF, "{model}"),
        ("{model}/model.safetensors", "corrupt safetensors header", "re-download"),
        build=b.model_with(b.cut("model.safetensors", lambda n: 100)),
    ),
    Row(
        "corrupt-safetensors-header",
        5,
        (*HF, "{model}"),
        ("{model}/model.safetensors", "corrupt safetensors header"),
        build=b.model_with(
            lambda p: (p / "model.safetensors").write_bytes(
                (d := (p / "model.safetensors").read_bytes())[:8] + b"\xff" * 32 + d[40:]
            )
        ),
    ),
    Row(
        "tensor-with-the-wrong-shape",
        5,
        (*HF, "{model}"),
        ("'model.layers.0.mlp.up_proj.weight'", "[100, 128]", "[384, 128]"),
        build=b.model_with(
            b.safetensors_edit(
                lambda s: s.update(
                    {"model.layers.0.mlp.up_proj.weight": __import__("torch").zeros(100, 128)}
                )
            )
        ),
    ),
    Row(
        "a-tensor-missing",
        5,
        (*HF, "{model}"),
        ("'model.norm.weight'", "[128]"),
        build=b.model_with(
            b.safetensors_edit(lambda s: {k: v for k, v in s.items() if k != "model.norm.weight"})
        ),
    ),
    Row(
        "index-naming-a-missing-shard",
        5,
        (*HF, "{model}"),
        (
            "{model}/model.safetensors.index.json",
            "names shard model-00002-of-00002.safetensors",
            "copy the missing shard",
        ),
        build=b.shards(lambda p: (p / "model-00002-of-00002.safetensors").unlink()),
        today="refused naming neither the index nor the missing shard",
    ),
    Row(
        "shard-names-without-a-number",
        5,
        (*HF, "{model}"),
        ("{model}/model.safetensors.index.json", "holds no number", "rename the shard"),
        build=b.shards(names=("first.safetensors", "second.safetensors")),
        today="AttributeError traceback, exit 1",
    ),
    Row(
        "shards-without-their-index",
        5,
        (*HF, "{model}"),
        ("{model}", "neither model.safetensors nor", "restore the model.safetensors.index.json"),
        build=b.shards(lambda p: (p / "model.safetensors.index.json").unlink()),
        today="trained, then the host reference was 'not computed'; exit 1",
    ),
    *(
        Row(
            f"config-model-type-{t}-for-{r}",
            5,
            (r, *HF[1:], "{model}"),
            (CFG, f"model_type is {t!r}", fix),
            build=b.model(model_type=t),
            today="trained as dense Qwen3, then a reference mismatch; exit 1",
        )
        for r, t, fix in [
            ("native_qwen3", "llama", "point --model-dir at a Qwen3ForCausalLM checkpoint"),
            ("native_qwen3", "qwen3_moe", "or run recipe hf_backend on it"),
            (
                "hf_backend",
                "llama",
                "point --model-dir at a Qwen3ForCausalLM or Qwen3MoeForCausalLM checkpoint",
            ),
        ]
    ),
    Row(
        "hf-backend-random-init-reads-config-json-too",
        5,
        ("hf_backend", "--init", "random", "--steps", "1", "--model-dir", "{model}"),
        (CFG, "model_type is 'llama'"),
        build=b.model(model_type="llama"),
    ),
    Row(
        "architectures-that-disagree-with-model-type",
        5,
        ("hf_backend", *HF[1:], "{model}"),
        (CFG, "disagree with model_type 'qwen3'", "re-copy config.json"),
        build=b.model(architectures=["Qwen3MoeForCausalLM"]),
        today="ranks started and failed, then the report's KeyError: 'tokenizer'; exit 1",
    ),
    *(
        Row(
            f"config-without-{k}",
            5,
            (*HF, "{model}"),
            (CFG, f"has no {named}", "re-copy config.json"),
            build=b.model(
                **(
                    {"rope_parameters": {"rope_type": "default"}}
                    if k == "rope_theta"
                    else {k: None}
                )
            ),
            today="trained, then the host reference raised or mismatched with every suspect ruled out; exit 1",
        )
        for k, named in [
            ("hidden_size", "hidden_size"),
            ("vocab_size", "vocab_size"),
            ("head_dim", "head_dim"),
            ("tie_word_embeddings", "tie_word_embeddings"),
            ("rope_theta", "rope_theta or rope_parameters.rope_theta"),
        ]
    ),
    Row(
        "config-size-given-as-a-string",
        5,
        (*HF, "{model}"),
        (CFG, "hidden_size is '128', not a positive integer", "re-copy config.json"),
        build=b.model(hidden_size="128"),
        never=("--allow-mismatch",),
        today="refused with the wrong fix 'accept with --allow-mismatch hidden_size'",
    ),
    Row(
        "config-not-valid-json",
        5,
        (*HF, "{model}"),
        (CFG, "is not valid JSON", "re-copy config.json"),
        build=b.model_with(b.rewrite("config.json", lambda t: '{"model_type": "qwen3",')),
    ),
    Row(
        "config-a-json-list",
        5,
        (*HF, "{model}"),
        (CFG, "holds a JSON list", "re-copy config.json"),
        build=b.model_with(b.rewrite("config.json", lambda t: "[1, 2]")),
    ),
    Row(
        "tokenizer-missing-from-the-model-dir",
        5,
        (*HF, "{model}"),
        ("{model}/tokenizer.json", "does not exist"),
        build=b.model_with(lambda p: (p / "tokenizer.json").unlink()),
    ),
    Row(
        "truncated-tokenizer-json",
        5,
        (*HF, "{model}"),
        ("{model}/tokenizer.json", "EOF while parsing", "re-copy tokenizer.json"),
        build=b.model_with(b.cut("tokenizer.json", lambda n: n // 2)),
        today="'EOF while parsing' traceback, exit 1",
    ),
    Row(
        "tokenizer-config-not-valid-json",
        5,
        (*HF, "{model}"),
        ("{model}/tokenizer_config.json", "is not valid JSON", "re-copy"),
        build=b.model_with(b.rewrite("tokenizer_config.json", lambda t: t[:-40])),
        today="ranks raised JSONDecodeError, then the report's KeyError: 'tokenizer'; exit 1",
    ),
    Row(
        "tokenizer-config-eos-not-a-string",
        5,
        (*HF, "{model}"),
        ("{model}/tokenizer_config.json", "eos_token is 5", "re-copy"),
        build=b.model_with(
            b.rewrite(
                "tokenizer_config.json", lambda t: json.dumps({**json.loads(t), "eos_token": 5})
            )
        ),
    ),
    Row(
        "tokenizer-moved-by-a-torchtitan-option",
        5,
        ("native_qwen3", "--init", "hf", "--hf_assets_path", "{model}"),
        ("{model}/tokenizer.json", "not a tokenizer", "re-copy tokenizer.json"),
        build=b.model_with(b.cut("tokenizer.json", lambda n: 1000)),
        fresh=True,
        slow=True,
        today="rank 0 raised 'EOF while parsing' in torchtitan's tokenizer, exit 1",
    ),
    # 6: data, sizes, parallelism, rendezvous: one line, never a traceback
    Row(
        "dataset-smaller-than-one-record-per-rank",
        6,
        (*PLAIN, "--dataset-dir", "{data}"),
        (
            "--dataset-dir {data} holds 1 record(s)",
            "2 data-parallel rank(s)",
            "add records (at least 2)",
        ),
        build=b.corpus(b'{"text": "hi"}\n'),
        today="rank 1 IndexError, then the report's KeyError traceback; exit 1",
    ),
    Row(
        "dataset-utf8-with-bom",
        6,
        (*PLAIN, "--dataset-dir", "{data}"),
        (
            "{data}/train.jsonl is UTF-8 text with a byte-order mark",
            "save it as UTF-8 without a byte-order mark",
            "utf-8-sig",
        ),
        build=b.corpus(BOM + CORPUS.read_bytes()),
        today="pyarrow ValueError, then the report's KeyError traceback; exit 1",
    ),
    Row(
        "dataset-utf16",
        6,
        (*PLAIN, "--dataset-dir", "{data}"),
        ("{data}/train.jsonl is UTF-16 text", "save it as UTF-8", "read_text('utf-16')"),
        build=b.corpus(CORPUS.read_text().encode("utf-16")),
        today="refused naming no encoding and no fix",
    ),
    Row(
        "dataset-latin1",
        6,
        (*PLAIN, "--dataset-dir", "{data}"),
        ("{data}/train.jsonl:2: not UTF-8", "Latin-1", "save the file as UTF-8"),
        build=b.corpus('{"text": "plain"}\n{"text": "caf\u00e9 cr\u00e8me"}\n'.encode("latin-1")),
    ),
    Row(
        "dataset-dir-missing",
        6,
        (*PLAIN, "--dataset-dir", "{in}/no-corpus"),
        ("{in}/no-corpus", "does not exist"),
    ),
    Row(
        "dataset-dir-that-is-a-file",
        6,
        (*PLAIN, "--dataset-dir", str(CORPUS)),
        (str(CORPUS), "is a file, not a directory", f"(e.g. {CORPUS.parent})"),
        today="refused as 'does not exist'",
    ),
    Row(
        "dataset-dir-empty",
        6,
        (*PLAIN, "--dataset-dir", "{data}"),
        ("{data}", "holds no *.jsonl or *.json data files", "put the corpus there"),
        build=b.corpus({}),
    ),
    Row(
        "dataset-empty-file",
        6,
        (*PLAIN, "--dataset-dir", "{data}"),
        ("{data}/train.jsonl", "holds no text"),
        build=b.corpus(b""),
    ),
    Row(
        "dataset-without-text",
        6,
        (*PLAIN, "--dataset-dir", "{data}"),
        ("{data}/train.jsonl", 'no non-empty "text"', '{{"text": "..."}}'),
        build=b.corpus(b'{"url": "x"}\n'),
    ),
    Row(
        "dataset-dir-where-datasets-would-read-other-files",
        6,
        (*PLAIN, "--dataset-dir", "{data}"),
        ("{data}", "as text files (notes.txt, todo.txt)", "move those files out"),
        build=b.corpus(
            {"corpus.jsonl": CORPUS.read_bytes(), "notes.txt": b"a note\n", "todo.txt": b"a list\n"}
        ),
        today="trained on the two .txt lines, the jsonl unread; a reference mismatch, exit 1",
    ),
    Row(
        "dataset-dir-without-a-train-split",
        6,
        (*PLAIN, "--dataset-dir", "{data}"),
        ("{data}", "finds no train split", "e.g. to train.jsonl"),
        build=b.corpus({"test.jsonl": CORPUS.read_bytes()}),
        today="ranks failed, then the report's KeyError: 'tokenizer'; exit 1",
    ),
    Row(
        "local-batch-size-0",
        6,
        (*PLAIN, "--training.local_batch_size", "0"),
        (
            "--training.local_batch_size 0 is not a positive integer",
            "pass a positive --training.local_batch_size",
        ),
        today="ranks failed (AssertionError), then the report's KeyError: 'tokenizer' traceback; exit 1",
    ),
    Row(
        "local-batch-size-0-on-the-real-command-line",
        6,
        (*PLAIN, "--training.local_batch_size", "0"),
        (
            "--training.local_batch_size 0 is not a positive integer",
            "pass a positive --training.local_batch_size",
        ),
        fresh=True,
        slow=True,
        today="torchtitan's 'initial_load_model_only=True has no effect' warning above the refusal",
    ),
    Row(
        "tensor-parallel-not-dividing-the-world",
        6,
        (*PLAIN, "--parallelism.tensor_parallel_degree", "3"),
        (
            "--parallelism.tensor_parallel_degree 3 does not divide the 2 rank(s)",
            "choose a divisor of 2",
        ),
        today="ranks failed (AssertionError), then the report's KeyError: 'tokenizer' traceback; exit 1",
    ),
    Row(
        "tensor-parallel-not-dividing-the-heads",
        6,
        (*PLAIN, "--nproc", "4", "--parallelism.tensor_parallel_degree", "4"),
        (
            "--parallelism.tensor_parallel_degree 4 does not divide the model's 4 attention heads and 2 key/value heads",
            "choose a common divisor",
        ),
        today="torchtitan asserts it on every rank",
    ),
    Row(
        "rdzv-endpoint-without-a-port",
        6,
        (*PLAIN, "--rdzv-endpoint", "localhost"),
        ("--rdzv-endpoint 'localhost' is not HOST:PORT", "e.g. --rdzv-endpoint 10.0.0.1:29500"),
        today="ignored: trained standalone, exit 0",
    ),
    Row(
        "rdzv-endpoint-port-not-a-number",
        6,
        (*PLAIN, "--nnodes", "2", "--rdzv-endpoint", "localhost:abc"),
        ("--rdzv-endpoint 'localhost:abc' is not HOST:PORT", "a port 1-65535"),
        today="torchrun failed, then the report's KeyError: 'tokenizer' traceback; exit 1",
    ),
    *(
        Row(
            f"bad-rank-start-then-{name}",
            6,
            argv,
            message,
            stage="options",
            code=code,
            env={"QWEN3_RANK_START": "bogus"},
            command=True,
            fresh=True,
            watch=False,
            slow=slow,
            today="every command, list and --help included, a 15-line ValueError traceback at import",
        )
        for name, argv, code, message, slow in [
            ("list", ("list",), 0, (), True),  # ~10 s: `list` imports the overrides (torch)
            ("help", ("--help",), 0, (), False),
            ("run-help", ("run", "--help"), 0, (), False),
            (
                "run",
                ("run", *PLAIN, "--report-dir", "{in}/report"),
                2,
                ("QWEN3_RANK_START='bogus'", "use one of exec, preloaded, or unset it"),
                True,
            ),
        ]
    ),
    # 7: no silent change
    Row(
        "layers-beyond-the-native-model",
        7,
        ("native_qwen3", "--init", "random", "--steps", "1", "--layers", "99"),
        (
            "--layers 99 is more than the 36 layers of the model recipe 'native_qwen3' builds (4B)",
            "choose --layers 1..36",
        ),
        today="clamped: trained 36 layers",
    ),
    Row(
        "layers-beyond-the-hf-backend-config",
        7,
        ("hf_backend", "--init", "hf", "--steps", "1", "--layers", "5"),
        (
            "--layers 5 is more than the 2 layers of",
            "qwen3-tiny/config.json",
            "choose --layers 1..2",
        ),
        today="refused with the wrong fix: 'accept with --allow-mismatch num_hidden_layers'",
    ),
    Row(
        "layers-on-a-recipe-that-builds-its-own",
        7,
        ("nki_moe", "--init", "random", "--steps", "1", "--layers", "2"),
        (
            "recipe 'nki_moe' builds its own 4 layers and does not take --layers (got 2)",
            "drop --layers",
        ),
        today="ignored: trained 4 layers",
    ),
    Row(
        "trn2-dataset-env-on-the-cpu-tier",
        7,
        PLAIN,
        (
            "QWEN3_DATASET_DIR={data} is set",
            "reads QWEN3_DATASET_DIR on trn2 only",
            "--dataset-dir {data}",
        ),
        build=b.corpus(CORPUS.read_bytes()),
        env={"QWEN3_DATASET_DIR": "{data}"},
        today="ignored: trained on fixtures/corpus",
    ),
    Row(
        "steps-not-a-number",
        7,
        ("native_qwen3", "--steps", "abc"),
        ("--steps takes {{None}}|INT, not 'abc'", "see python -m harness run --help"),
        stage="options",
        today="tyro's 14-line error box; exit 2",
    ),
    Row(
        "dry-run-as-a-command",
        7,
        ("dry-run",),
        (
            "unknown command 'dry-run'",
            "choose one of list, run, history",
            "python -m harness run RECIPE --dry-run",
        ),
        stage="options",
        command=True,
        prefix="python -m harness: error: ",
        today="the usage text, no error line",
    ),
    Row(
        "relative-torchtitan-path-from-the-current-directory",
        7,
        (*PLAIN, "--hf_assets_path", "model"),
        ("{model}/tokenizer.json", "not a tokenizer", "re-copy tokenizer.json"),
        build=b.model_with(b.cut("tokenizer.json", lambda n: 1000)),
        from_inputs=True,
        today="read from the repository root: refused as '<repo>/model does not exist'",
    ),
    Row(
        "relative-model-dir-from-the-current-directory",
        7,
        (*HF, "model"),
        (CFG, "head_dim is 16"),
        build=b.model(num_attention_heads=8, head_dim=16),
        from_inputs=True,
    ),
    # issue 46 item 5: a harness option and the torchtitan option it sets, given different values
    *(
        Row(
            f"{ours[2:]}-and-{theirs[2:]}-differ",
            7,
            (*PLAIN, *extra, ours, a, theirs, b_),
            (
                f"{ours} {a} and {theirs} {b_} set the same torchtitan option",
                "give only one of them",
            ),
            stage="options",
            build=build,
            today=f"ran with {theirs} {b_}, no word",
        )
        for ours, a, theirs, b_, extra, build in [
            ("--steps", "2", "--training.steps", "3", (), None),
            ("--seq-len", "128", "--training.seq_len", "64", (), None),
            ("--local-batch-size", "2", "--training.local_batch_size", "4", (), None),
            ("--seed", "1", "--debug.seed", "2", (), None),
            (
                "--dataset-dir",
                "{data}",
                "--dataloader.dataset_path",
                "{repo}/fixtures/corpus",
                (),
                b.copies,
            ),
        ]
    ),
    # issue 46 item 4: the run's peak host memory per rank, weighed before launch (harness.checks.memory)
    Row(
        "local-batch-size-beyond-the-hosts-memory",
        6,
        (*PLAIN, "--local-batch-size", "5000"),
        (
            "--local-batch-size 5000 (x seq_len 256 x vocab 1024) needs about",
            "GB per rank (parameters",
            "logits",
            "x 2 rank(s) =",
            "more than the",
            "GB this host has available",
            "choose --local-batch-size",
        ),
        today="ran 226 s (the corpus re-looped 27 times), then the kernel's OOM killer took rank 0 at 11.5 GB "
        "resident; the report said only 'torchrun exited 1'",
    ),
    # the command line and the tier
    Row("unknown-recipe", 7, ("qwen9_native",), ("qwen9_native", "native_qwen3"), fresh=True),
    Row("unknown-tier", 7, ("native_qwen3", "--tier", "tpu"), ("'tpu'", "cpu, trn2")),
    Row(
        "trn2-tier-without-a-neuron-device",
        7,
        ("native_qwen3", "--tier", "trn2"),
        ("--tier trn2", "no Neuron device", "--tier cpu"),
    ),
    Row(
        "rope-hf-seq-len-not-a-multiple-of-128-x-lnc",
        7,
        (
            "native_qwen3",
            "--init",
            "random",
            "--steps",
            "1",
            "--override",
            "rope_hf",
            "--seq-len",
            "200",
        ),
        (
            "seq_len=200 is not a multiple of 128×LNC=256 (LNC=2); use 256.",
            "set training.seq_len to a multiple of 256",
        ),
    ),
    Row(
        "compile-backend-not-the-tiers",
        7,
        (*PLAIN, "--compile.enable", "--compile.backend", "neuron"),
        (
            "compile.enable with compile.backend='neuron' cannot compile for --tier cpu: use --compile.backend inductor",
            "or drop --compile.enable",
        ),
    ),
]


@dataclass(frozen=True)
class Elsewhere:
    """A case whose test keeps its own subprocess harness (or is a reader's unit test): named here, run there."""

    id: str
    point: int
    stage: str
    #: None: no command runs (a reader or a unit of the launcher is called).
    code: int | None
    message: str
    #: ``module::function`` or ``module::function[param id]`` in tests/cpu.
    test: str


RS, INT, REF = (
    "test_report_safety::",
    "test_interrupts::test_an_interrupt_keeps_what_was_measured",
    "test_refusals_before_launch::",
)
READER = RS + "test_every_reader_names_a_missing_or_partial_provenance"
ELSEWHERE = [
    # 1: a failed run never poisons a report
    Elsewhere(
        "ranks-die-before-provenance-then-a-good-run",
        1,
        "rank start",
        1,
        "FAILED: torchrun exited 1",
        "test_bad_inputs_table::test_after_the_failing_rows_a_second_run_into_the_same_report_dir_succeeds",
    ),
    *(
        Elsewhere(
            f"reader-{case.replace(' ', '-')}",
            1,
            "report",
            None,
            "ranks failed before provenance was written",
            f"{READER}[{case}]",
        )
        for case in ("no provenance.json", "provenance.json cut short", "provenance.json a list")
    ),
    Elsewhere(
        "reader-provenance-partial",
        1,
        "report",
        None,
        "provenance.json is partial (no weights, ...)",
        f"{READER}[provenance.json partial]",
    ),
    *(
        Elsewhere(
            f"launcher-keys-the-inputs-{case.replace(' ', '-')}",
            1,
            "report",
            None,
            "",
            f"{RS}test_the_launcher_keys_the_inputs_of_any_provenance_and_leaves_an_unreadable_one_as_it_is[{case}]",
        )
        for case in (
            "no provenance.json",
            "provenance.json cut short",
            "provenance.json a list",
            "provenance.json partial",
        )
    ),
    Elsewhere(
        "failed-run-in-results-md",
        1,
        "report",
        None,
        "FAILED: ...; ranks failed before provenance was written",
        RS + "test_a_run_that_failed_before_provenance_is_reported_with_what_is_known",
    ),
    Elsewhere(
        "results-json-unreadable",
        1,
        "report",
        None,
        "kept as results.json.unreadable-1",
        RS + "test_an_unreadable_results_json_is_kept_aside_and_the_report_starts_again",
    ),
    Elsewhere(
        "band-lane-steps-a-killed-rank-left",
        1,
        "report",
        None,
        "a line cut short is not a step",
        RS + "test_the_band_lane_reads_the_steps_a_killed_rank_left",
    ),
    # issue 46 item 1: what the suite did not write is kept, and said
    Elsewhere(
        "report-dir-holding-a-foreign-results-md",
        2,
        "report",
        None,
        "kept as results.md.foreign-1",
        RS + "test_a_results_md_the_suite_did_not_write_is_kept_aside_and_said",
    ),
    Elsewhere(
        "run-dir-carries-its-marker",
        2,
        "checks",
        None,
        "",
        RS + "test_every_directory_the_suite_writes_says_what_wrote_it",
    ),
    Elsewhere(
        "overwrite-at-publish-of-a-foreign-file",
        2,
        "training",
        None,
        "notes.txt is not listed there",
        "test_export_safety::test_overwrite_at_publish_refuses_a_directory_the_suite_did_not_write",
    ),
    # issue 46 item 3: every reader and tool refuses a bad file in one line on stderr, exit 2
    *(
        Elsewhere(
            f"tool-{case}",
            1,
            "checks",
            2,
            "one line on stderr naming the file, what it is and the fix",
            f"test_tools_refuse::test_a_tool_refuses_a_bad_file_in_one_line_on_stderr[{case}]",
        )
        for case in (
            *(f"history-{w}" for w in ("empty", "binary", "directory", "fifo", "foreign")),
            *(f"ci-{w}" for w in ("empty", "binary", "directory", "fifo", "foreign", "list")),
            "ci-trend-a-directory",
            *(f"benchmarks-{w}" for w in ("binary", "directory", "foreign")),
            "reference-failed-run",
            "reference-a-file",
            "bump-refused-pin",
        )
    ),
    # issue 46 item 6: a diagnosis says only what it checked
    Elsewhere(
        "a-400-token-tokenizer-in-a-copy-of-the-model-dir",
        5,
        "reference",
        None,
        "tokenizer: the run's tokenizer (...): its 400 ids against config.json's vocab_size 1024 ...; not measured",
        "test_diagnosis_says_what_it_checked::test_a_400_token_tokenizer_inside_a_copy_of_the_model_dir_is_not_ruled_out",
    ),
    Elsewhere(
        "an-allowed-mismatch-is-a-suspect",
        5,
        "reference",
        None,
        "rms_norm_eps: allowed by --allow-mismatch rms_norm_eps: ...; still suspect: rms_norm_eps",
        "test_diagnosis_says_what_it_checked::test_every_mismatch_the_run_allowed_is_a_suspect_never_none_of_the_known",
    ),
    Elsewhere(
        "the-report-dir-vanished-mid-run",
        1,
        "training",
        None,
        "FAILED: the report directory REPORT vanished during the run (...); torchrun exited 1",
        "test_diagnosis_says_what_it_checked::test_a_report_dir_that_vanished_during_the_run_is_said",
    ),
    # issue 46 item 4: a rank ended by a signal is named with it, the OOM killer where the kernel says so
    Elsewhere(
        "a-rank-killed-by-sigkill",
        1,
        "training",
        1,
        "FAILED: ... torchrun exited 1; rank 1 was killed by SIGKILL (signal 9, pid N)",
        "test_faults::test_a_rank_killed_by_a_signal_is_named_with_it",
    ),
    *(
        Elsewhere(
            f"oom-killer-named-from-the-{where}",
            1,
            "report",
            None,
            "; the kernel's OOM killer sent it (kernel log: ...)",
            f"test_rank_deaths::test_the_oom_killer_is_named_when_the_{test}",
        )
        for where, test in (
            ("kernel-log", "kernel_log_says_so"),
            ("cgroup", "cgroup_counts_a_new_kill"),
        )
    ),
    # 3: two runs never share a run directory
    Elsewhere(
        "two-launches-in-one-second",
        3,
        "training",
        0,
        "each run in a run directory of its own",
        RS + "test_two_launches_in_the_same_second_never_share_a_run_directory",
    ),
    Elsewhere(
        "one-name-claimed-twice",
        3,
        "checks",
        None,
        "r-20260101-000000-2",
        RS + "test_run_directories_are_claimed_exclusively",
    ),
    # 4: every interrupt leaves a report and the right exit code
    Elsewhere(
        "sigint-during-the-checks",
        4,
        "checks",
        130,
        "INTERRUPTED by SIGINT during the checks",
        f"{INT}[SIGINT-checks]",
    ),
    Elsewhere(
        "sigint-during-rank-start",
        4,
        "rank start",
        130,
        "INTERRUPTED by SIGINT during the rank start",
        f"{INT}[SIGINT-rank_start]",
    ),
    Elsewhere(
        "sigint-to-a-pipeline-during-rank-start",
        4,
        "rank start",
        130,
        "INTERRUPTED by SIGINT during the rank start",
        f"{INT}[SIGINT_to_a_pipeline-rank_start]",
    ),
    Elsewhere(
        "sigint-twice-during-training",
        4,
        "training",
        130,
        "INTERRUPTED by SIGINT during the training",
        f"{INT}[SIGINT_twice-training]",
    ),
    Elsewhere(
        "sigterm-during-the-reference",
        4,
        "reference",
        143,
        "INTERRUPTED by SIGTERM during the reference",
        f"{INT}[SIGTERM-reference]",
    ),
    Elsewhere(
        "sigint-during-the-report",
        4,
        "report",
        130,
        "INTERRUPTED by SIGINT during the report",
        f"{INT}[SIGINT-report]",
    ),
    Elsewhere("stdout-closed-after-two-lines", 4, "training", 0, "", f"{INT}[pipe-training]"),
    Elsewhere(
        "a-second-signal-while-the-first-is-handled",
        4,
        "report",
        None,
        "",
        "test_interrupts::test_the_first_stop_signal_waits_out_a_deferred_block_and_the_next_are_ignored",
    ),
    Elsewhere(
        "interrupt-before-torchrun-started",
        4,
        "rank start",
        143,
        "INTERRUPTED by SIGTERM during the rank start",
        "test_interrupts::test_an_interrupt_before_torchrun_started_names_that_run_not_started",
    ),
    *(
        Elsewhere(
            f"output-whose-reader-left-{r}",
            4,
            "training",
            None,
            "",
            f"test_interrupts::test_output_whose_reader_left_is_dropped_not_raised[{r}]",
        )
        for r in ("pipe", "terminal")
    ),
    # 5: never advise accepting a golden for a run on other inputs
    *(
        Elsewhere(
            f"not-judged-against-the-golden-on-another-{w}",
            5,
            "reference",
            None,
            "not judged",
            f"{REF}test_a_run_on_other_inputs_is_not_judged_against_the_tiers_golden[{w}]",
        )
        for w in ("model_dir", "dataset_dir", "tokenizer_dir")
    ),
    # 7: no silent hang
    Elsewhere(
        "nnodes-2-without-a-second-node",
        7,
        "rank start",
        None,
        "the rendezvous at HOST:PORT did not gather --nnodes 2 nodes within --rdzv-timeout 20 s, so no rank started",
        REF
        + "test_a_node_whose_peers_never_come_says_so_while_waiting_and_ends_at_the_rendezvous_timeout",
    ),
    Elsewhere(
        "dry-run-lists-every-planned-run",
        7,
        "checks",
        0,
        "",
        "test_dry_run::test_every_planned_run_passes_and_starts_nothing",
    ),
    # 8: the tests that prove this can fail
    Elsewhere(
        "hidden-torchtitan-name-refused-in-process",
        8,
        "checks",
        2,
        "",
        "test_titan_names::test_the_command_line_refuses_a_hidden_name_like_main_in_process",
    ),
    Elsewhere(
        "a-refusal-ends-the-prestarted-launcher",
        8,
        "checks",
        2,
        "",
        "test_rank_start::test_a_refused_run_leaves_no_prestarted_process",
    ),
    Elsewhere(
        "a-blind-finder-fails",
        8,
        "checks",
        None,
        "",
        "test_processes::test_a_watch_that_saw_nothing_fails_before_none_left_is_believed",
    ),
    Elsewhere(
        "a-failing-lifecycle-test-ends-its-2000-step-run",
        8,
        "training",
        143,
        "INTERRUPTED by SIGTERM",
        "test_lifecycle::test_sigterm_ends_every_rank_and_keeps_the_steps_run",
    ),
    Elsewhere(
        "a-rank-dying-on-the-exec-path",
        8,
        "training",
        None,
        "die on rank 1 at step 2",
        "test_faults::test_a_rank_that_dies_mid_run_fails_the_run_with_its_log_lines",
    ),
    # 9: torchtitan's own entry, twice and after another recipe
    Elsewhere(
        "readme-command-twice-then-another-recipe",
        9,
        "training",
        0,
        "",
        "test_config_functions::test_the_readme_command_trains_again_and_after_another_recipe",
    ),
    Elsewhere(
        "a-finished-entry-run-is-never-reopened",
        9,
        "training",
        None,
        "",
        "test_entry_folder::test_a_finished_run_is_never_reopened",
    ),
    Elsewhere(
        "an-interrupted-entry-run-is-resumed",
        9,
        "training",
        None,
        "",
        "test_entry_folder::test_an_interrupted_run_is_resumed_in_its_own_folder",
    ),
]


# --- running a row ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def previous_report(tmp_path_factory) -> Path:
    """A report dir as a run whose ranks died before provenance.json left it: the issue's poisoner."""
    from test_report_safety import failed_before_provenance

    from harness.report import results as report

    path = tmp_path_factory.mktemp("previous") / "report"
    report.update(path, runs=[failed_before_provenance(path)])
    return path


@pytest.fixture
def going_run(tmp_path):
    """A process of a run still going, as the process finder sees one (its run directory in its environment).

    Started detached (``sh`` exits, its ``sleep`` is re-parented), as a run from another terminal is:
    not a descendant of this process. Ended here by its pid.
    """
    from harness.base import run_dir

    live = tmp_path / "elsewhere" / "runs" / "going"
    live.mkdir(parents=True)
    export = str(live.parent.parent / "export")
    (live / run_dir.RUN_FILE).write_text(json.dumps({"export_dir": export}) + "\n")
    env = {**os.environ, run_dir.RUN_DIR_ENV: str(live)}
    out = subprocess.run(
        ["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(out.stdout.strip())
    yield live
    os.kill(pid, signal.SIGTERM)


def needs_live(row: Row) -> bool:
    return any("{live}" in text for text in (*row.args, *row.guarded))


@pytest.mark.parametrize(
    "row", [pytest.param(r, id=r.id, marks=[pytest.mark.slow] if r.slow else []) for r in ROWS]
)
def test_a_bad_input_ends_in_one_line_and_changes_nothing(
    row, tmp_path, previous_report, request, monkeypatch, record_property
):
    report = tmp_path / "report"
    shutil.copytree(previous_report, report)
    live = request.getfixturevalue("going_run") if needs_live(row) else None
    _, elapsed = b.run_row(row, tmp_path / "in", report, live, monkeypatch)
    record_property("refusal_s", round(elapsed, 2))


def test_sharded_weights_with_their_index_pass(tmp_path):
    """The control of the shard rows: the same shards, all present, are accepted."""
    from harness.checks.inputs import check_weights

    headers = check_weights(b.shard_fixture(tmp_path))
    assert sorted(headers) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert (
        sum(map(len, headers.values())) == 24
    )  # every tensor of the 2-layer fixture, tied head dropped


def test_the_going_run_is_seen_by_the_finder_the_check_uses(going_run):
    """The refusals of a going run are not a finder that finds nothing: the same finder sees this one."""
    from harness.checks.targets import running_run_dirs

    assert going_run in running_run_dirs()


# --- the table as a whole ------------------------------------------------------------------------------------


def outcome(row: Row | Elsewhere) -> str:
    """What the row's command ends in. A traceback or a lost input is no outcome here: every row asserts neither."""
    if row.code is None:
        return "a reader or unit, no command"
    if row.code == 0:
        return "works"
    return (
        "refused before launch"
        if row.stage in ("options", "checks")
        else "stopped after launch, reported"
    )


def test_the_table_counts_every_case_once():
    rows = [*ROWS, *ELSEWHERE]
    assert len({r.id for r in rows}) == len(rows), "a case is in the table twice"
    assert all(r.stage in STAGES and 1 <= r.point <= 9 for r in rows)
    counts = {o: sum(outcome(r) == o for r in rows) for o in sorted({outcome(r) for r in rows})}
    assert counts == {
        "a reader or unit, no command": 31,
        "refused before launch": 130,
        "stopped after launch, reported": 9,
        "works": 7,
    }, counts
    assert sorted({r.point for r in rows}) == list(range(1, 10)), (
        "every point of issue 35 has a row"
    )


def test_every_row_elsewhere_is_a_test_there():
    interrupts = {r.id: r for r in importlib.import_module("test_interrupts").ROWS}
    for row in ELSEWHERE:
        module, _, name = row.test.partition("::")
        function, _, param = name.partition("[")
        fn = getattr(importlib.import_module(module), function, None)
        assert callable(fn) and function.startswith("test_"), f"{row.id}: no test {row.test}"
        if param:
            assert param.rstrip("]") in b.param_ids(fn), (
                f"{row.id}: {function} has no case {param.rstrip(']')}"
            )
        if function == "test_an_interrupt_keeps_what_was_measured":
            there = interrupts[param.rstrip("]")]
            assert (there.code, there.stage) == (row.code, row.stage), (row.id, there)


# --- after the failing rows, a second run into the same report dir -------------------------------------------


@pytest.mark.slow
def test_after_the_failing_rows_a_second_run_into_the_same_report_dir_succeeds(
    tmp_path, request, monkeypatch
):
    """Every in-process row that writes into the report dir it is given, into one report dir; then a run whose
    ranks die before provenance.json (the issue's case); then a good run there, which must succeed."""
    from harness.base import run_dir
    from harness.report import results as report

    shared = tmp_path / "shared-report"
    live = request.getfixturevalue("going_run")
    into_shared = [r for r in ROWS if not (r.fresh or r.command or "--report-dir" in r.args)]
    assert len(into_shared) == 97, (
        "every row but those with a report dir or a command line of their own"
    )
    for row in into_shared:
        b.run_row(row, tmp_path / "rows" / row.id, shared, live, monkeypatch)
    (tmp_path / "in").mkdir()
    inputs = b.copies(tmp_path / "in")
    args = ("--model-dir", str(inputs["model"]), "--dataset-dir", str(inputs["data"]))
    before = b.digests(tmp_path / "in")
    died = b.harness_run(shared, *args, env={"QWEN3_REPRO_FAULT": "die@0:0"})
    assert died.returncode == 1, died.stderr[-3000:]
    assert "Traceback (most recent call last)" not in died.stderr.split("--- rank")[0], died.stderr[
        -3000:
    ]
    assert run_dir.NO_PROVENANCE in (shared / report.RESULTS_MD).read_text()
    good = b.harness_run(shared, *args)
    assert good.returncode == 0, good.stderr[-3000:]
    runs = json.loads((shared / report.RESULTS_JSON).read_text())["runs"]
    assert [bool(r.get("error")) for r in runs] == [True, False], [r.get("error") for r in runs]
    assert len({r["run_dir"] for r in runs}) == 2
    assert b.digests(tmp_path / "in") == before
