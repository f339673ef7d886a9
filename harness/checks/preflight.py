"""Refuse a bad run before any rank starts: one message that names the value and the fix.

The options are checked here; the files they name (config.json, weights, tokenizer, data) are checked
by ``harness.checks.inputs``, whose ``PreflightError`` this re-exports, and the directories a run writes
by ``harness.checks.targets``. Each refusal's home: docs/ARCHITECTURE.md, "Every refusal → file".
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from harness.checks import inputs as input_checks
from harness.checks.inputs import (
    JSONL_FIX,
    PreflightError,
    check_jsonl_text,
    jsonl_problem,
    read_safetensors_header,
)
from harness.checks.targets import (
    check_dump_folder_target,
    check_export_target,
    check_output_dir,
    check_replaceable_export,
    check_run_target,
)
from harness.checks.weights import check_config_matches_weights
from harness.options.run_options import INITS, RunOptions
from recipes import hf_config, titan
from recipes.platform import tier_unavailable
from recipes.platform.neuron import parse_visible_cores
from recipes.registry import RECIPES, get_recipe
from recipes.tiers import REPO_ROOT, TIERS, rank_start_problem

__all__ = [
    "JSONL_FIX",
    "PreflightError",
    "check_jsonl_text",
    "jsonl_problem",
    "preflight",
    "read_safetensors_header",
]


def check_names(opts: RunOptions) -> None:

    if opts.recipe not in RECIPES:
        raise PreflightError(
            f"unknown recipe {opts.recipe!r}; choose one of: {', '.join(RECIPES)} "
            "(see `python -m harness list`)"
        )
    if opts.tier not in TIERS:
        raise PreflightError(f"unknown tier {opts.tier!r}; choose one of: {', '.join(TIERS)}")
    if opts.init not in INITS:
        raise PreflightError(f"unknown --init {opts.init!r}; choose one of: {', '.join(INITS)}")
    supported = RECIPES[opts.recipe].inits
    if opts.init not in supported:
        raise PreflightError(
            f"recipe {opts.recipe!r} does not support --init {opts.init}; use --init {' or '.join(supported)}"
        )


def check_tier(opts: RunOptions) -> None:

    reason = tier_unavailable(opts.tier) or rank_start_problem(TIERS[opts.tier])
    if reason:
        raise PreflightError(reason)
    if opts.tier != "trn2":
        return
    check_visible_cores(opts.nproc, os.environ.get("NEURON_RT_VISIBLE_CORES"))


def check_visible_cores(nproc: int, visible: str | None) -> None:
    """A user-set ``NEURON_RT_VISIBLE_CORES`` must not hand every rank the same cores.

    torchrun passes its environment unchanged to each of the ``nproc`` ranks of a
    node, so a set value is the same for all of them: each rank's runtime would try
    to claim the same cores. Unset, each local rank is to get its own logical core.
    A public development copy of torch_neuronx does that itself (parmoham-aws/test-repo-parmoham
    torch_neuronx/distributed/backend.py, ``_set_rt_visible_cores``: when NEURON_RT_VISIBLE_CORES is
    unset it is set to LOCAL_RANK as the "neuron" process group is created, and ``_neuron_runtime_setup``
    asserts the runtime was not initialized before ``init_process_group``). The released 2.14.3 is not
    public (aws-neuron/torch-neuronx cannot be fetched here; the runtime and torch.neuron docs do not
    say), so the rehearsal runs both settings of that
    behaviour (rehearsal/settings.py). ``NEURON_RT_VISIBLE_CORES`` syntax (one index or an
    inclusive range): aws-neuron/aws-neuron-sdk tools/neuron-sys-tools/neuron-ls.rst
    (``neuroncore_ids``) and the runtime configuration docs.
    """

    if visible is None:
        return
    try:
        cores = parse_visible_cores(visible)
    except ValueError:
        raise PreflightError(
            f"NEURON_RT_VISIBLE_CORES={visible!r} is not a core index or an inclusive range "
            "such as '3' or '0-15'; fix or unset it"
        ) from None
    if nproc > 1:
        raise PreflightError(
            f"NEURON_RT_VISIBLE_CORES={visible} is set, and torchrun hands that same value to each of the "
            f"{nproc} ranks, so every rank would claim the same {len(cores)} core(s); unset "
            "NEURON_RT_VISIBLE_CORES for a multi-rank run (each rank then gets its own core), "
            "or run the neuron tests serially (-p no:xdist)"
        )


def check_cpu_dataset(opts: RunOptions) -> None:
    """``$QWEN3_DATASET_DIR`` names trn2's corpus; on the cpu tier (fixtures/corpus) it is refused, never ignored.

    Called with the options as given: ``--dataset-dir`` chooses the corpus on any tier.
    """
    env = os.environ.get("QWEN3_DATASET_DIR")
    if opts.tier == "cpu" and opts.dataset_dir is None and env:
        raise PreflightError(
            f"QWEN3_DATASET_DIR={env} is set, but the cpu tier trains on its own corpus ({TIERS['cpu'].dataset_path}) "
            f"and reads QWEN3_DATASET_DIR on trn2 only; to train on it here pass --dataset-dir {env}, "
            "or unset QWEN3_DATASET_DIR"
        )


def check_trn2_dataset(opts: RunOptions) -> None:
    """trn2 trains on the user's corpus only; the fixture corpus is a cpu-tier stand-in."""
    if opts.tier == "trn2" and opts.dataset_dir is None:
        raise PreflightError(
            "--tier trn2 needs a dataset and has no fallback: set QWEN3_DATASET_DIR (or pass "
            '--dataset-dir) to a directory of *.jsonl files with one {"text": ...} object per line, '
            "e.g. torchtitan's tests/assets/c4_test"
        )


#: Sizes a refusal names as a field, not a flag: the harness sets them (tyro.conf.Suppress in RunOptions).
HARNESS_SET_SIZES = ("threads",)


def check_sizes(opts: RunOptions) -> None:
    for name in (
        "nproc",
        "steps",
        "seq_len",
        "local_batch_size",
        "layers",
        "rdzv_timeout",
        *HARNESS_SET_SIZES,
    ):
        value = getattr(opts, name)
        if value is not None and value < 1:
            what = (
                f"RunOptions.{name} (set by the harness)"
                if name in HARNESS_SET_SIZES
                else f"--{name.replace('_', '-')}"
            )
            raise PreflightError(f"{what} must be a positive integer, got {value}")


def check_forward_only(opts: RunOptions) -> None:
    """A forward-only run measures step 1's loss and nothing else: one step, nothing exported."""
    if opts.forward_only and (opts.steps not in (None, 1) or opts.export):
        raise PreflightError(
            f"a forward-only run scores step 1 only, got steps={opts.steps} export={opts.export}; "
            "set steps=1 and export=False, or forward_only=False to train"
        )


def check_mismatch_names(opts: RunOptions) -> None:
    from harness.checks.mismatch import MISMATCH_NAMES  # noqa: PLC0415 -- heavy: it imports recipes.specs, so torch (2.9 s); the checks stay light

    unknown = [n for n in opts.allow_mismatch if n not in MISMATCH_NAMES]
    if unknown:
        raise PreflightError(
            f"--allow-mismatch {unknown[0]!r} is not a mismatch name; choose from: {', '.join(MISMATCH_NAMES)}"
        )


def check_nodes(opts: RunOptions) -> None:
    if opts.nnodes < 1 or not 0 <= opts.node_rank < opts.nnodes:
        raise PreflightError(
            f"--node-rank {opts.node_rank} must be in 0..{opts.nnodes - 1} for --nnodes {opts.nnodes}"
        )
    if opts.nnodes > 1 and not opts.rdzv_endpoint:
        raise PreflightError(
            f"--nnodes {opts.nnodes} needs --rdzv-endpoint HOST:PORT (node 0's address, reachable from every node)"
        )
    if opts.rdzv_endpoint is not None:
        check_rdzv_endpoint(opts.rdzv_endpoint)


def check_rdzv_endpoint(endpoint: str) -> None:
    """HOST:PORT as torchrun's c10d rendezvous parses it: a host, a colon, a port in 1..65535 (IPv6 in [ ])."""
    host, colon, port = endpoint.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    fine = (
        bool(colon)
        and bool(host.strip())
        and " " not in endpoint
        and port.isdigit()
        and 0 < int(port) < 65536
    )
    if not fine:
        raise PreflightError(
            f"--rdzv-endpoint {endpoint!r} is not HOST:PORT (a host name or address, a colon and a port 1-65535); "
            "pass node 0's address and a free port, e.g. --rdzv-endpoint 10.0.0.1:29500"
        )


def read_hf_config(model_dir) -> dict:
    """``model_dir``'s config.json as one JSON object, refused as a ``PreflightError`` (``recipes.hf_config``)."""
    return hf_config.read_hf_config(model_dir, PreflightError)


def check_model_config(opts: RunOptions) -> None:
    """When the run reads config.json (its weights, or the HF backend's model): a model the recipe trains."""

    if opts.model_dir is None or not RECIPES[opts.recipe].reads_config(opts.init):
        return
    hf = read_hf_config(opts.model_dir)
    input_checks.check_model_config(opts.model_dir / "config.json", hf, opts.recipe, opts.init)


def check_model_dir(opts: RunOptions) -> None:
    """With ``--init hf``: the weights directory, its config.json and every safetensors header and index entry."""
    if opts.init != "hf":
        return
    model_dir = opts.model_dir
    if model_dir is None:
        raise PreflightError(
            f"--init hf needs weights: pass --model-dir DIR (for --tier {opts.tier} set "
            "QWEN3_4B_DIR to a local Qwen3-4B-Instruct-2507 directory), or use --init random"
        )
    if not model_dir.is_dir():
        state = "is a file, not a directory" if model_dir.exists() else "does not exist"
        raise PreflightError(
            f"--model-dir {model_dir} {state}; point it at a Hugging Face model directory "
            "(config.json, tokenizer.json, *.safetensors)"
        )
    check_model_config(opts)
    headers = input_checks.check_weights(model_dir)
    check_config_matches_weights(model_dir / "config.json", read_hf_config(model_dir), headers)


def check_tokenizer(opts: RunOptions) -> None:
    """The recipes read the tokenizer from --tokenizer-dir, else the model directory: it must load."""
    input_checks.check_tokenizer_dir(opts.tokenizer_dir)


def check_checkpoint_tensors(opts: RunOptions, spec) -> None:
    """Every weight the recipe's model needs is in the checkpoint, with the shape it needs."""
    if opts.init != "hf" or opts.model_dir is None:
        return

    on_disk: dict[str, tuple[str, list[int]]] = {}
    where: dict[str, Path] = {}
    for path in sorted(opts.model_dir.glob("*.safetensors")):
        for key, meta in read_safetensors_header(path).items():
            on_disk[key], where[key] = meta, path
    import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; the checks stay light until a check needs a model

    with torch.device("meta"):
        model = spec.model.build()
    adapter = spec.state_dict_adapter(spec.model, str(opts.model_dir))
    expected = {k: list(v.shape) for k, v in adapter.to_hf(model.state_dict()).items()}
    tied = getattr(spec.model, "enable_weight_tying", False)
    for key, shape in expected.items():
        if key not in on_disk:
            if tied and key == "lm_head.weight":
                continue
            raise PreflightError(
                f"{opts.model_dir} has no tensor {key!r} (shape {shape}) that recipe {opts.recipe!r} needs; "
                "point --model-dir at weights of this model"
            )
        if on_disk[key][1] != shape:
            raise PreflightError(
                f"{where[key]}: tensor {key!r} has shape {on_disk[key][1]}, recipe {opts.recipe!r} needs "
                f"{shape}; point --model-dir at weights of this model"
            )
    extra = sorted(set(on_disk) - set(expected))
    if extra:
        raise PreflightError(
            f"{where[extra[0]]}: tensor {extra[0]!r} is not part of recipe {opts.recipe!r}'s model "
            f"({len(extra)} such tensors); point --model-dir at weights of this model"
        )


def check_dataset_dir(opts: RunOptions) -> None:
    """The files torchtitan's loader reads from --dataset-dir, every record with its "text"."""
    input_checks.check_dataset_dir(opts.dataset_dir)


def check_export_dir(opts: RunOptions) -> None:
    export_dir = opts.export_dir
    if export_dir is None:
        return
    if not opts.export:
        raise PreflightError(
            f"--export-dir {export_dir} and --no-export contradict each other; drop one"
        )
    if opts.model_dir is not None:
        source = opts.model_dir.resolve()
        target = export_dir.resolve()
        if target == source or source in target.parents:
            raise PreflightError(
                f"--export-dir {export_dir} is inside the source --model-dir {opts.model_dir}; "
                "the source weights are never written to: choose another directory"
            )
    check_export_target(opts)  # before "pass --overwrite": never advise replacing an input
    check_output_dir(
        export_dir, "pass an --export-dir that is a writable directory, or a new path in one"
    )
    if not (export_dir.is_dir() and any(export_dir.iterdir())):
        return
    check_replaceable_export(
        export_dir
    )  # before "pass --overwrite": never advise replacing a report
    if not opts.overwrite:
        raise PreflightError(
            f"--export-dir {export_dir} is not empty; pass --overwrite to replace it, "
            "or choose a new directory"
        )


def check_run_dir(opts: RunOptions) -> None:
    """The run's directory (``REPORT_DIR/runs/NAME``: run.json, logs, checkpoints) can be made and written."""
    if opts.run_dir is None:
        return
    check_output_dir(
        opts.run_dir, "pass a --report-dir that is a writable directory, or a new path in one"
    )
    check_run_target(opts)


def check_hf_model(opts: RunOptions) -> None:
    """Refuse an ``hf_model`` the backend cannot build from, before any rank starts.

    Runs are offline, so ``hf_model`` must be a local directory with a
    config.json describing a Qwen3 causal LM. (Weights for ``--init hf`` are
    checked by ``check_model_dir``.)
    """

    recipe = get_recipe(opts.recipe)
    if (
        not recipe.builds_from_config
    ):  # its module names the ARCHITECTURES it trains and its tutorial's HUB_ID
        return
    module = importlib.import_module(recipe.module)
    ARCHITECTURES, HUB_ID = module.ARCHITECTURES, module.HUB_ID  # noqa: N806

    offline = "runs are offline (HF_HUB_OFFLINE=1) and download nothing"
    if opts.model_dir is None:
        raise PreflightError(
            f"hf_model would be the Hub ID {HUB_ID!r}, but {offline}: download it elsewhere "
            "and pass --model-dir DIR (trn2: set QWEN3_4B_DIR to it)"
        )
    if not opts.model_dir.is_dir():
        raise PreflightError(
            f"--model-dir {opts.model_dir} is not a local directory. hf_model cannot be a Hub ID "
            f"such as {HUB_ID!r}: {offline}. Download the model elsewhere and pass its directory"
        )
    architectures = read_hf_config(opts.model_dir).get("architectures") or []
    if not set(architectures) & set(ARCHITECTURES):
        raise PreflightError(
            f"{opts.model_dir / 'config.json'} describes {architectures or 'no architectures'}; "
            f"recipe {opts.recipe!r} trains Qwen3 causal LMs ({', '.join(ARCHITECTURES)}): point "
            "--model-dir at a Qwen3 checkpoint"
        )
    check_model_config(opts)


def check_torchtitan_names(opts: RunOptions) -> None:
    """The installed torchtitan has every name this run uses (``recipes.titan``), else one line naming the
    first missing one (the others counted)."""

    errors = titan.missing(titan.run_tags(opts.recipe, opts.overrides, opts.tier))
    if errors:
        more = f" ({len(errors) - 1} more torchtitan name(s) missing)" if len(errors) > 1 else ""
        raise PreflightError(f"{errors[0]}{more}")


#: What can be checked from the options alone, on any machine (the dry run runs these too).
OPTION_CHECKS = (
    check_names,
    check_sizes,
    check_forward_only,
    check_nodes,
    check_mismatch_names,
    check_torchtitan_names,
    check_cpu_dataset,
)


def preflight(opts: RunOptions) -> RunOptions:
    """Every check of the options and the files they name; returns the resolved options."""
    for check in OPTION_CHECKS:
        check(opts)
    resolved = opts.resolved()
    check_tier(
        resolved
    )  # no device at all is the first thing a user on the wrong machine must hear
    check_trn2_dataset(resolved)
    check_hf_model(resolved)
    check_model_dir(resolved)
    check_tokenizer(resolved)
    check_dataset_dir(resolved)
    check_export_dir(resolved)
    check_run_dir(resolved)
    return resolved


def check_config_paths(opts: RunOptions, config) -> None:
    """The tokenizer, data and run directory the built config names, where torchtitan options moved them.

    ``--hf_assets_path``, ``--dataloader.dataset_path`` and ``--dump_folder`` reach the config after
    ``preflight`` checked the run's own paths; relative ones are read from the ranks' working
    directory, the repository root.
    """

    def where(value) -> Path | None:
        return (REPO_ROOT / value).resolve() if value else None

    tokenizer_dir = where(config.hf_assets_path)
    if tokenizer_dir is not None and tokenizer_dir != opts.tokenizer_dir:
        input_checks.check_tokenizer_dir(tokenizer_dir)
    dataset_dir = where(getattr(config.dataloader, "dataset_path", None))
    if dataset_dir is not None and dataset_dir != opts.dataset_dir:
        input_checks.check_dataset_dir(dataset_dir)
    run_dir = where(config.dump_folder)
    if run_dir is not None and run_dir != opts.run_dir:
        check_output_dir(
            run_dir, "pass a --dump_folder that is a writable directory, or a new path in one"
        )
        check_dump_folder_target(opts, run_dir)
