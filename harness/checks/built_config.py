"""The built config's refusals: inputs against the model, compile on the tier (kernel shapes: ``kernels.py``).

Run by the launcher (:func:`harness.config.build.checked_config`) and the dry run, once, before
any rank starts. Each takes the ``Trainer.Config`` the ranks will build; none builds it.
"""

from __future__ import annotations

from pathlib import Path

from harness.checks.errors import PreflightError
from harness.checks.kernels import check_kernel_constraints
from harness.checks.memory import check_memory
from harness.options.run_options import RunOptions
from recipes.tiers import REPO_ROOT, TIERS


def check_inputs(opts: RunOptions, config) -> None:
    """Refuse a tokenizer, weights or sizes that disagree with the model the recipe builds."""
    from harness.checks.mismatch import check as check_mismatches  # noqa: PLC0415 -- heavy: harness.checks.mismatch imports torch (torch 2.9 s); this module stays light
    from harness.checks.preflight import check_checkpoint_tensors  # noqa: PLC0415 -- heavy: harness.checks.preflight imports torch (torch 2.9 s); this module stays light

    check_layers(opts, config)
    check_training_sizes(config)
    check_parallelism(opts, config)
    check_mismatches(opts, config)
    if not hasattr(config, "hf_model"):  # the HF backend builds what config.json describes
        check_checkpoint_tensors(opts, config.model_spec)


def config_json(config) -> dict:
    """The HF backend's config.json (the model it builds), as the suite reads it."""
    from recipes.specs import read_hf_dims  # noqa: PLC0415 -- heavy: recipes.specs imports torch (torch 2.9 s); this module stays light

    return read_hf_dims(Path(config.hf_model))


def check_layers(opts: RunOptions, config) -> None:
    """``--layers N`` keeps N layers of the model, never more than it has and never silently another count.

    A native recipe truncates the real model's list of layers (99 of 36 kept 36); the HF backend
    builds N from config.json (more than the weights hold); config 3 builds its own 4.
    """
    if opts.layers is None:
        return
    if hasattr(config, "hf_model"):
        depth = config_json(config).get("num_hidden_layers")
        if isinstance(depth, int) and opts.layers > depth:
            raise PreflightError(
                f"--layers {opts.layers} is more than the {depth} layers of {Path(config.hf_model) / 'config.json'} "
                f"(num_hidden_layers); choose --layers 1..{depth}"
            )
        return
    built = len(config.model_spec.model.layers)
    if built < opts.layers:
        raise PreflightError(
            f"--layers {opts.layers} is more than the {built} layers of the model recipe {opts.recipe!r} builds "
            f"({config.model_spec.flavor.split('[')[0]}); choose --layers 1..{built}"
        )
    if built != opts.layers:
        raise PreflightError(
            f"recipe {opts.recipe!r} builds its own {built} layers and does not take --layers (got {opts.layers}); "
            "drop --layers"
        )


#: ``config.training`` sizes a rank divides or loops by: torchtitan's own parser takes 0 and negatives.
TRAINING_SIZES = ("steps", "seq_len", "local_batch_size")


def check_training_sizes(config) -> None:
    """The built config's steps, seq_len and batch (a torchtitan ``--training.*`` option may have set them)."""
    for name in TRAINING_SIZES:
        value = getattr(config.training, name)
        if not isinstance(value, int) or value < 1:
            raise PreflightError(
                f"--training.{name} {value} is not a positive integer (every rank would fail at its first step); "
                f"pass a positive --training.{name} or drop it for the tier's default"
            )


def check_parallelism(opts: RunOptions, config) -> None:
    """Tensor parallelism divides the world and the heads; every data-parallel rank gets a record of the corpus."""
    from harness.checks.inputs import count_records  # noqa: PLC0415 -- heavy: harness.checks.inputs imports torch (torch 2.9 s); this module stays light

    p = config.parallelism
    world = opts.nproc * opts.nnodes
    tp = p.tensor_parallel_degree
    fixed = (
        tp
        * p.context_parallel_degree
        * p.pipeline_parallel_degree
        * p.data_parallel_replicate_degree
    )
    if tp < 1 or world % fixed:
        raise PreflightError(
            f"--parallelism.tensor_parallel_degree {tp} does not divide the {world} rank(s) of the run "
            f"(--nproc {opts.nproc} x --nnodes {opts.nnodes}, with the other parallel degrees {fixed // max(tp, 1)}); "
            f"choose a divisor of {world}, e.g. 1"
        )
    heads = heads_of(config)
    if tp > 1 and any(n % tp for n in heads):
        raise PreflightError(
            f"--parallelism.tensor_parallel_degree {tp} does not divide the model's {heads[0]} attention heads and "
            f"{heads[1]} key/value heads (each TP rank takes a whole number of them); choose a common divisor, e.g. 1"
        )
    dp = world // fixed

    dataset_path = getattr(config.dataloader, "dataset_path", None)
    data = (
        (REPO_ROOT / dataset_path).resolve() if dataset_path else None
    )  # the ranks' working directory
    if (
        data is None or not data.is_dir()
    ):  # a missing one is preflight's refusal (a dry run's stand-in: none)
        return
    records = count_records(data, dp)
    if records < dp:
        raise PreflightError(
            f"--dataset-dir {data} holds {records} record(s), fewer than the run's {dp} data-parallel rank(s), each "
            f"of which reads its own share of the records (a rank with none fails at its first batch); add records "
            f"(at least {dp}) or run fewer ranks (--nproc)"
        )


def heads_of(config) -> tuple[int, int]:
    """(attention heads, key/value heads) of the model the config builds."""
    if hasattr(config, "hf_model"):
        hf = config_json(config)
        return hf["num_attention_heads"], hf.get("num_key_value_heads") or hf["num_attention_heads"]
    attention = config.model_spec.model.layers[0].attention
    return attention.n_heads, attention.n_kv_heads


def check_compile(config, tier: str) -> None:
    """Refuse ``compile.enable`` with a ``compile.backend`` other than the tier's (``neuron`` on trn2).

    Run after torchtitan's CLI overrides, which may enable compile or change the backend.
    """

    preset = TIERS[tier]
    if config.compile.enable and config.compile.backend != preset.compile_backend:
        raise PreflightError(
            f"compile.enable with compile.backend={config.compile.backend!r} cannot compile for --tier {tier}: "
            f"use --compile.backend {preset.compile_backend} (TorchNeuron's torch.compile backend on trn2), "
            "or drop --compile.enable"
        )


def check_built(opts: RunOptions, config) -> list[str]:
    """The checks of the config as built, whatever it loads: compile backend on the tier, kernel shapes, and the
    ranks' host memory where they run on the host (:mod:`harness.checks.memory`)."""

    check_compile(config, opts.tier)
    checked = [f"compile: {'off' if not config.compile.enable else config.compile.backend}"]
    checked += check_kernel_constraints(config, opts.tier)
    memory = check_memory(opts, config)
    return checked + ([memory] if memory else [])


def check_config(opts: RunOptions, config) -> list[str]:
    """Every check of the built config; what was checked, for the dry run's report."""
    check_inputs(opts, config)
    return check_built(opts, config)
