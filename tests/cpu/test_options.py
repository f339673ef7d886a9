"""Each run option is declared once (``harness.options.run_options.RunOptions``): the CLI, run.json and the ranks follow it."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from harness.base.run_dir import RUN_FILE
from harness.options.run_options import (
    RunCommand,
    RunOptions,
    command_line,
    flag,
    parse_run_command,
    read_run_options,
)
from recipes.errors import RecipeError
from recipes.tiers import REPO_ROOT

#: A value unlike every field's default, so a field the CLI drops or mis-parses shows.
NON_DEFAULT = dict(
    recipe="nki_moe",
    tier="trn2",
    nproc=3,
    nnodes=2,
    node_rank=1,
    rdzv_endpoint="node0:29500",
    rdzv_timeout=60,
    steps=7,
    seq_len=512,
    local_batch_size=4,
    layers=2,
    init="random",
    model_dir=Path("/m"),
    dataset_dir=Path("/d"),
    tokenizer_dir=Path("/t"),
    rope_theta=5e6,
    allow_mismatch=["rope_theta", "vocab"],
    export_dir=Path("/e"),
    seed=3,
    overrides=["rope_hf", "rope_hf=layers.1[0-9].attention.rope"],
    overwrite=True,
    export=False,
    localize=True,
)


#: Fields the harness sets and the CLI does not expose (tyro.conf.Suppress): run.json carries them.
HARNESS_SET = dict(forward_only=True, threads=2)


def test_non_default_covers_every_cli_field():
    """The round trip below exercises every field the CLI exposes (run_dir is the harness's to name)."""
    assert set(NON_DEFAULT) == {f.name for f in fields(RunOptions)} - {"run_dir", *HARNESS_SET}
    assert all(NON_DEFAULT[k] != getattr(RunOptions(), k) for k in NON_DEFAULT)
    assert all(HARNESS_SET[k] != getattr(RunOptions(), k) for k in HARNESS_SET)


def test_fields_the_harness_sets_survive_run_json():
    opts = RunOptions(**NON_DEFAULT, **HARNESS_SET)
    assert RunOptions.from_json(opts.to_json()) == opts


def test_every_option_survives_the_cli_and_run_json():
    opts = RunOptions(**NON_DEFAULT)
    command, torchtitan = parse_run_command(
        [*command_line(opts), "--lr_scheduler.warmup_steps", "3"]
    )
    assert command.options() == opts
    assert torchtitan == ["--lr_scheduler.warmup_steps", "3"]
    assert RunOptions.from_json(opts.to_json()) == opts


def test_the_cli_has_one_flag_per_field_and_nothing_else():
    out = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    shown = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", out.stdout)) - {"--help"}
    command_only = {"--report-dir", "--dry-run", "--no-dry-run"}
    expected = {
        flag(f.name)
        for f in fields(RunOptions)
        if f.name not in ("recipe", "run_dir", *HARNESS_SET)
    }
    expected |= {"--no-" + flag(name)[2:] for name in ("overwrite", "export", "localize")}
    # --model-dir etc. also appear inside help sentences; every shown flag must be a real one
    assert shown - command_only <= expected
    assert expected <= shown


def test_a_repeated_option_collects_every_value():
    command, _ = parse_run_command(
        ["native_qwen3", "--override", "a", "--override", "b=x,y", "--allow-mismatch", "v"]
    )
    assert (command.overrides, command.allow_mismatch) == (["a", "b=x,y"], ["v"])
    assert command.init is None  # `run` without --init runs every init the recipe has


def test_an_ill_typed_option_is_refused_by_the_parser_in_one_line():
    """From tyro's parse-error event, not its 14-line box (``python -m harness run`` prints it, exit 2)."""
    from recipes.errors import RecipeError

    with pytest.raises(
        RecipeError,
        match=r"^--steps takes \{None\}\|INT, not 'three' \(.*\); see python -m harness run --help$",
    ):
        parse_run_command(["native_qwen3", "--steps", "three"])


def test_the_rank_reads_run_json_and_this_launchs_world(tmp_path, monkeypatch):
    opts = RunOptions(**NON_DEFAULT, run_dir=tmp_path)
    (tmp_path / RUN_FILE).write_text(opts.to_json())
    for key, value in dict(
        LOCAL_WORLD_SIZE="2", WORLD_SIZE="4", GROUP_RANK="1", MASTER_ADDR="h", MASTER_PORT="9"
    ).items():
        monkeypatch.setenv(key, value)
    read = read_run_options(tmp_path)
    assert (read.nproc, read.nnodes, read.node_rank, read.rdzv_endpoint) == (2, 2, 1, "h:9")
    assert read.overrides == opts.overrides and read.model_dir == opts.model_dir


def test_a_rank_without_run_json_is_refused_in_one_line(tmp_path):
    with pytest.raises(
        RecipeError, match=r"run\.json does not exist: harness\.rank\.train runs the options"
    ) as refusal:
        read_run_options(tmp_path)
    assert "\n" not in str(refusal.value)


def test_run_json_from_another_version_names_the_unknown_fields():
    with pytest.raises(ValueError, match=r"\['recipe_name'\] are not fields of RunOptions"):
        RunOptions.from_json('{"recipe_name": "x"}')


def test_the_command_options_are_run_options_plus_the_commands_own():
    own = {f.name for f in fields(RunCommand)} - {f.name for f in fields(RunOptions)}
    assert own == {"report_dir", "dry_run"}


@pytest.mark.slow
def test_listing_into_a_pipe_that_closes_early_is_quiet():
    """``python -m harness list | head -1``: the first line, no BrokenPipeError traceback."""
    out = subprocess.run(
        f"{sys.executable} -m harness list | head -1",
        shell=True,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout == "recipes:\n"
    assert "Traceback" not in out.stderr and "BrokenPipeError" not in out.stderr, out.stderr


@pytest.mark.parametrize("changes", [dict(steps=5, export=False), dict(steps=1, export=True)])
def test_a_forward_only_run_that_would_train_or_export_is_refused(changes):
    """Seen failing with check_forward_only left out of OPTION_CHECKS: preflight passed."""
    from harness.checks.preflight import PreflightError, preflight

    with pytest.raises(PreflightError, match=r"a forward-only run scores step 1 only") as refusal:
        preflight(RunOptions(forward_only=True, **changes))
    assert "\n" not in str(refusal.value)


def test_threads_must_be_positive():
    from harness.checks.preflight import PreflightError, preflight

    with pytest.raises(
        PreflightError,
        match=r"^RunOptions\.threads \(set by the harness\) must be a positive integer, got 0$",
    ):
        preflight(RunOptions(threads=0))  # a field, not a flag: there is no --threads


def test_a_harness_option_and_its_torchtitan_option_may_agree():
    """Issue 46 item 5's control: the same value given both ways is no override."""
    from harness.options.mapped import check_one_value

    check_one_value(["run", "x", "--steps", "3"], ["--training.steps", "3"])
    check_one_value(["--seq-len=64"], ["--training.seq-len", "64"])
