"""The tutorial's launch settings all three recipes share: data, tokenizer, batch, parallelism, checkpoints.

A recipe picks its model; ``tutorial_settings`` makes the rest of the
``Trainer.Config`` the tutorial's launch on a tier, so the recipes differ only
where the tutorial's configs differ. Nothing here knows about runs, goldens or
reports: the harness (``harness/``) applies a run's own steps, seq_len, seed and
paths on top (``harness.options.run_options.apply_run_options``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from recipes.errors import RecipeError
from recipes.registry import get_recipe
from recipes.tiers import TIERS, Tier

INITS = ("hf", "random")


@dataclass(frozen=True)
class RecipeInputs:
    """What a recipe's config is built from: where it runs and the weights, tokenizer and data it starts with."""

    tier: str = "cpu"
    #: ``hf`` loads ``model_dir``'s weights (``initial_load_in_hf``); ``random`` starts from the seed.
    init: str = "hf"
    model_dir: Path | None = None
    tokenizer_dir: Path | None = None
    dataset_dir: Path | None = None
    #: Keep the first N layers of the real model (cpu tier: the real width, not tiny dims).
    layers: int | None = None

    @property
    def tier_preset(self) -> Tier:
        return TIERS[self.tier]

    @classmethod
    def for_tier(cls, tier: str, init: str = "hf") -> "RecipeInputs":
        """The tier's own weights, tokenizer and data; refused in one line when the tier cannot run here.

        On trn2 they come from ``$QWEN3_4B_DIR`` and ``$QWEN3_DATASET_DIR`` (``recipes.tiers``).
        """
        from recipes.platform import tier_unavailable  # noqa: PLC0415 -- --help stays fast: recipes.platform (on python -m harness's import path)

        reason = tier_unavailable(tier)
        if reason:
            raise RecipeError(reason)
        preset = TIERS[tier]
        for value, env in (
            (preset.model_dir, "QWEN3_4B_DIR"),
            (preset.dataset_path, "QWEN3_DATASET_DIR"),
        ):
            if value is None:
                raise RecipeError(
                    f"--tier {tier} reads its weights and data from the environment: set {env}"
                )
        return cls(
            tier,
            init,
            preset.model_dir,
            preset.tokenizer_for(preset.model_dir),
            preset.dataset_path,
        )


def tutorial_settings(config, inputs: RecipeInputs):
    """Make ``config`` (a recipe's model choice) the tutorial's launch on ``inputs.tier``.

    Steps, seq_len and batch are the tier's defaults; a checkpoint loads
    ``model_dir``'s HF weights when ``init`` is ``hf`` and the last step is saved in
    HF format (``last_save_in_hf``), as in the tutorial. Returns ``config``.
    """
    from recipes.titan import (  # noqa: PLC0415 -- lazy: recipes.titan resolves torchtitan names on first use, after recipes.platform.install
        CheckpointManager,
        ChunkedLossWrapper,
        CrossEntropyLoss,
        Decoder,
        HuggingFaceTextDataLoader,
        MetricsProcessor,
        decoder_vocab_size,
    )

    tier = inputs.tier_preset
    # A torchtitan decoder's vocab is known here; the HF backend sets its loss's vocab itself.
    if config.model_spec is not None and isinstance(config.model_spec.model, Decoder.Config):
        config.loss = ChunkedLossWrapper.Config(
            loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec))
        )
    config.hf_assets_path = str(inputs.tokenizer_dir)
    config.dataloader = HuggingFaceTextDataLoader.Config(
        dataset="c4_test", dataset_path=str(inputs.dataset_dir), infinite=True
    )
    config.metrics = MetricsProcessor.Config(log_freq=1)
    config.lr_scheduler.warmup_steps = min(config.lr_scheduler.warmup_steps, tier.warmup_steps)

    config.training.steps = tier.steps
    config.training.seq_len = tier.seq_len
    config.training.local_batch_size = tier.local_batch_size
    config.training.global_batch_size = -1
    config.training.mixed_precision_param = tier.param_dtype

    config.parallelism.data_parallel_shard_degree = -1
    config.parallelism.data_parallel_replicate_degree = 1
    config.parallelism.tensor_parallel_degree = 1
    config.parallelism.context_parallel_degree = 1
    config.parallelism.pipeline_parallel_degree = 1

    config.debug.seed = 0
    config.debug.deterministic = tier.deterministic
    config.compile.enable = config.compile.enable and tier.compile_allowed
    config.compile.backend = (
        tier.compile_backend
    )  # so a later --compile.enable compiles for this device

    load_hf = inputs.init == "hf"
    config.checkpoint = CheckpointManager.Config(
        enable=True,
        folder="checkpoint",
        interval=tier.steps,
        initial_load_path=str(inputs.model_dir) if load_hf else None,
        initial_load_in_hf=load_hf,
        initial_load_model_only=load_hf,
        last_save_model_only=True,
        last_save_in_hf=True,
        export_dtype=tier.export_dtype,
        keep_latest_k=2,
        load_only=False,
    )
    return config


def tier_config(recipe: str, tier: str, init: str = "hf"):
    """The complete ``Trainer.Config`` of ``recipe`` on ``tier``: what the zero-argument config functions return.

    So torchtitan's own entry runs a recipe as the tutorial does::

        torchrun --nproc_per_node=64 -m torchtitan.train \\
            --module recipes.native_qwen3 --config native_qwen3_trn2 [--training.steps 3]

    torchtitan's ConfigManager imports ``--module`` and calls ``--config`` with no
    arguments (torchtitan/config/manager.py ``_load_config``). The platform is
    installed here: torchtitan.train has imported torchtitan already, and
    ``install`` also repoints imported modules. The harness's refusals (weights vs
    model, tokenizer, dataset lines) are not run on this path: ``python -m harness
    run`` adds them.

    Each launch dumps into ``outputs/<recipe>_<tier>_<init>/run-N``
    (``recipes.entry_folder``), not torchtitan's shared ``./outputs``: there a second
    recipe, or the same command again, resumed from the tutorial's HF-format last save
    and died. Only this path: ``python -m harness run`` sets its own run directory. An
    explicit ``--dump_folder`` is applied after this and used as given.
    """
    from recipes import platform  # noqa: PLC0415 -- --help stays fast: recipes.platform (on python -m harness's import path)
    from recipes.entry_folder import entry_dump_folder  # noqa: PLC0415 -- --help stays fast: recipes.entry_folder (on python -m harness's import path)

    inputs = RecipeInputs.for_tier(tier, init)
    platform.install(tier)
    config = get_recipe(recipe).config_fn()(inputs)
    config.dump_folder = str(entry_dump_folder(f"{recipe}_{tier}_{init}", config.checkpoint.folder))
    return config


def set_rope_theta(config, theta: float) -> None:
    """Every RoPE of the model gets ``theta``."""
    from recipes.titan import RoPE  # noqa: PLC0415 -- lazy: recipes.titan resolves torchtitan names on first use, after recipes.platform.install

    for _, rope, _, _ in config.traverse(RoPE.Config):
        rope.theta = theta
