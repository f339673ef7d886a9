"""Settings all three recipes share: data, tokenizer, batch, parallelism, checkpoints, seed.

A recipe picks its model; ``apply_run_options`` makes the rest of the
``Trainer.Config`` the tutorial's launch on the chosen tier, so the recipes
differ only where the tutorial's configs differ.
"""

from __future__ import annotations

from recipes.options import RunOptions


def tier_config(recipe: str, tier: str, init: str = "hf", allow_mismatch: tuple[str, ...] = ()):
    """The complete ``Trainer.Config`` a recipe launches with on ``tier`` by default.

    What the zero-argument config functions (``native_qwen3_trn2()``, ...) return, so
    torchtitan's own entry runs a recipe exactly as ``python -m recipes run`` does::

        torchrun --nproc_per_node=64 -m torchtitan.train \\
            --module recipes.native_qwen3 --config native_qwen3_trn2 [--training.steps 3]

    torchtitan's ConfigManager imports ``--module`` and calls ``--config`` with no
    arguments (torchtitan/config/manager.py ``_load_config``). Weights and data come
    from the tier (on trn2 ``$QWEN3_4B_DIR`` and ``$QWEN3_DATASET_DIR``), refused in
    one line when missing. The platform is installed here: torchtitan.train has
    imported torchtitan already, and ``install`` also repoints imported modules.
    """
    from recipes import platform
    from recipes.preflight import preflight
    from recipes.train import build_config

    opts = preflight(RunOptions(recipe=recipe, tier=tier, init=init, allow_mismatch=list(allow_mismatch)))
    platform.install(tier)
    return build_config(opts)


def apply_run_options(config, opts: RunOptions):
    """Fill the run-dependent parts of a recipe's ``Trainer.Config`` from ``opts``.

    ``opts`` must be ``RunOptions.resolved()``. Returns ``config`` for chaining.
    """
    from recipes.titan import (
        CheckpointManager,
        ChunkedLossWrapper,
        CrossEntropyLoss,
        Decoder,
        decoder_vocab_size,
        HuggingFaceTextDataLoader,
        MetricsProcessor,
    )

    tier = opts.tier_preset
    # A torchtitan decoder's vocab is known here; the HF backend sets its loss's vocab itself.
    if config.model_spec is not None and isinstance(config.model_spec.model, Decoder.Config):
        config.loss = ChunkedLossWrapper.Config(
            loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec))
        )
    config.hf_assets_path = str(opts.tokenizer_dir)
    config.dataloader = HuggingFaceTextDataLoader.Config(
        dataset="c4_test", dataset_path=str(opts.dataset_dir), infinite=True
    )
    config.metrics = MetricsProcessor.Config(log_freq=1)
    config.lr_scheduler.warmup_steps = min(config.lr_scheduler.warmup_steps, tier.warmup_steps)

    config.training.steps = opts.steps
    config.training.seq_len = opts.seq_len
    config.training.local_batch_size = opts.local_batch_size
    config.training.global_batch_size = -1
    config.training.mixed_precision_param = tier.param_dtype

    config.parallelism.data_parallel_shard_degree = -1
    config.parallelism.data_parallel_replicate_degree = 1
    config.parallelism.tensor_parallel_degree = 1
    config.parallelism.context_parallel_degree = 1
    config.parallelism.pipeline_parallel_degree = 1

    config.debug.seed = opts.seed
    config.debug.deterministic = tier.deterministic
    config.compile.enable = False if tier.name == "cpu" else config.compile.enable

    if opts.rope_theta is not None:
        set_rope_theta(config, opts.rope_theta)

    run_dir = opts.run_dir
    config.dump_folder = str(run_dir) if run_dir else config.dump_folder
    load_hf = opts.init == "hf"
    config.checkpoint = CheckpointManager.Config(
        enable=load_hf or opts.export,
        folder="checkpoint",
        interval=opts.steps,
        initial_load_path=str(opts.model_dir) if load_hf else None,
        initial_load_in_hf=load_hf,
        initial_load_model_only=load_hf,
        last_save_model_only=True,
        last_save_in_hf=True,
        export_dtype="float32" if tier.name == "cpu" else "bfloat16",
        keep_latest_k=2,
        load_only=not opts.export,
    )
    return config


def set_rope_theta(config, theta: float) -> None:
    """Every RoPE of the model gets ``theta`` (``--rope-theta``)."""
    from recipes.titan import RoPE

    for _, rope, _, _ in config.traverse(RoPE.Config):
        rope.theta = theta
