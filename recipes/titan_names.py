"""The table of every torchtitan name the suite depends on (``recipes.titan`` resolves and checks them).

Each :class:`TitanName` says where a name lives, why the suite needs it and who uses it; hooks say the code
that must call them. Data only: importing this module imports no torchtitan.
"""

from __future__ import annotations

from dataclasses import dataclass

#: ``used_by`` tag for names every recipe needs.
EVERY_RUN = "every run"


@dataclass(frozen=True)
class TitanName:
    """One torchtitan name: where it lives, why the suite needs it, who uses it."""

    name: str
    """What the suite imports it as (``from recipes.titan import <name>``)."""
    module: str
    purpose: str
    used_by: tuple[str, ...] = (EVERY_RUN,)
    """Recipe or override names that need it (``EVERY_RUN``: all of them)."""
    attr: str = ""
    """Dotted path inside ``module`` when it differs from ``name``."""
    keywords: tuple[str, ...] = ()
    """Keyword arguments the suite passes to ``attr`` + ``keywords_of``; a fork without one is refused."""
    keywords_of: str = ""
    """Dotted path, relative to the object, whose signature takes ``keywords`` (e.g. ``Config``)."""
    read_by: str = ""
    """A hook: dotted path in ``module`` whose code must read the name's last part."""
    sets: tuple[str, ...] = ()
    """A hook: instance attributes the function ``attr`` (an ``__init__``) must assign."""
    required: bool = True
    """False: absent is a finding the report shows, not a refusal (the fork's own config 3)."""
    files: tuple[str, ...] = ()
    """Product files relying on it without importing it; importers, and the harness's own files, are found
    by harness.checks.titan."""

    @property
    def qualified(self) -> str:
        hook = self.sets or self.read_by
        return f"{self.module}.{self.name if hook else (self.attr or self.name)}"


_RUN_CONFIG = "the tutorial's launch settings (recipes/tutorial.py tutorial_settings)"
_SPECS = "building the tiny cpu specs and the shrunk 30B-A3B (recipes/specs.py sized_spec)"
#: Who needs the override machinery: both kernels, and config 3, which applies grouped_experts itself.
_OVERRIDES = ("rope_hf", "grouped_experts", "nki_moe")
#: Who imports recipes/kernels/rope.py: rope_hf, and config 3 (its sliced, gather-free RoPE lives there).
_ROPE_MODULE = ("rope_hf", "nki_moe")
_HF = ("hf_backend",)
_HF_PKG = "torchtitan.experiments.transformers_modeling_backend"

NAMES: tuple[TitanName, ...] = (
    # --- the trainer and its config --------------------------------------------------
    TitanName(
        "Trainer",
        "torchtitan.trainer",
        "Trainer.Config is the config every recipe returns; .traverse finds RoPE and kernel nodes, "
        ".to_dict writes the resolved config of a dry run",
    ),
    TitanName(
        "ConfigManager",
        "torchtitan.config.manager",
        "parsing torchtitan CLI overrides (--training.steps ...) on top of a recipe's Trainer.Config",
    ),
    TitanName(
        "on_parse_error",
        "tyro._errors",
        "turning a torchtitan option its parser (tyro, tyro >= 1.0.14) "
        "refuses into one line from tyro's structured event, not its printed box; absent, tyro's own message "
        "stands above a generic refusal",
        required=False,
    ),
    TitanName(
        "TORCH_DTYPE_MAP",
        "torchtitan.config",
        "the dtype the dry run builds the model in (training.dtype), as the trainer does",
    ),
    TitanName(
        "set_default_dtype",
        "torchtitan.tools.utils",
        "building the model on the meta device in training.dtype, as the trainer does (dry run)",
    ),
    TitanName(
        "CompileConfig",
        "torchtitan.config",
        "tutorial config 3 runs eager: CompileConfig(enable=False)",
        used_by=("nki_moe",),
        keywords=("enable",),
    ),
    # --- run settings shared by every recipe -----------------------------------------
    TitanName(
        "CheckpointManager",
        "torchtitan.components.checkpoint",
        "loading Hugging Face weights (--init hf) and writing the HF export",
        keywords=(
            "enable",
            "folder",
            "interval",
            "initial_load_path",
            "initial_load_in_hf",
            "initial_load_model_only",
            "last_save_model_only",
            "last_save_in_hf",
            "export_dtype",
            "keep_latest_k",
            "load_only",
        ),
        keywords_of="Config",
    ),
    TitanName(
        "CrossEntropyLoss",
        "torchtitan.components.loss",
        "the loss over the swapped-in model's own vocab (global_vocab_size), " + _RUN_CONFIG,
        keywords=("global_vocab_size",),
        keywords_of="Config",
    ),
    TitanName(
        "ChunkedLossWrapper",
        "torchtitan.components.loss",
        "wrapping that loss as the recipes' qwen3 configs do, " + _RUN_CONFIG,
        keywords=("loss_fn",),
        keywords_of="Config",
    ),
    TitanName(
        "MetricsProcessor",
        "torchtitan.components.metrics",
        "logging every step (log_freq=1) so each step's loss reaches steps.jsonl",
        keywords=("log_freq",),
        keywords_of="Config",
    ),
    TitanName(
        "LoggerContainer",
        "torchtitan.components.metrics",
        "recording torchtitan's own step metrics beside its loggers (the harness's record_steps)",
    ),
    TitanName(
        "HuggingFaceTextDataLoader",
        "torchtitan.hf_datasets.text_datasets",
        'reading the local {"text": ...} corpus (dataset_path) without a download',
        keywords=("dataset", "dataset_path", "infinite"),
        keywords_of="Config",
    ),
    TitanName(
        "decoder_vocab_size",
        "torchtitan.models.common.config_utils",
        "the vocab of a torchtitan decoder spec, for the loss, " + _RUN_CONFIG,
    ),
    TitanName(
        "Decoder",
        "torchtitan.models.common.decoder",
        "telling a torchtitan decoder spec from the HF backend's model, " + _RUN_CONFIG,
    ),
    TitanName(
        "RoPE",
        "torchtitan.models.common.rope",
        "--rope-theta sets the theta of every RoPE node (config.traverse(RoPE.Config))",
    ),
    # --- Qwen3 specs ---------------------------------------------------------------------
    TitanName(
        "model_registry",
        "torchtitan.models.qwen3",
        'the Qwen3 specs the recipes start from: model_registry("4B") and ("30B-A3B")',
        keywords=("attn_backend",),
    ),
    TitanName(
        "ScaledDotProductAttention",
        "torchtitan.models.common.attention",
        'SDPA in every layer, what the tutorial\'s attn_backend="sdpa" means (recipes/specs.py)',
        used_by=("native_qwen3", "nki_moe"),
    ),
    TitanName(
        "qwen3_32b",
        "torchtitan.models.qwen3.config_registry",
        'tutorial config 2 starts from qwen3_32b() and swaps in model_registry("4B")',
        used_by=("native_qwen3",),
    ),
    TitanName(
        "qwen3_30b_a3b",
        "torchtitan.models.qwen3.config_registry",
        "tutorial config 3 starts from qwen3_30b_a3b() and shrinks it to 4 layers / 64 experts / top-4",
        used_by=("nki_moe",),
    ),
    TitanName(
        "CosSinRoPE",
        "torchtitan.models.common",
        _SPECS + "; the RoPE rope_hf replaces",
        used_by=("native_qwen3", *_ROPE_MODULE),
    ),
    TitanName("Embedding", "torchtitan.models.common", _SPECS, used_by=("native_qwen3", "nki_moe")),
    TitanName("Linear", "torchtitan.models.common", _SPECS, used_by=("native_qwen3", "nki_moe")),
    TitanName(
        "RMSNorm",
        "torchtitan.models.common.nn_modules",
        _SPECS,
        used_by=("native_qwen3", "nki_moe"),
    ),
    TitanName(
        "skip_param_init",
        "torchtitan.models.common.param_init",
        _SPECS,
        used_by=("native_qwen3", "nki_moe"),
    ),
    TitanName(
        "make_gqa_config",
        "torchtitan.models.common.config_utils",
        _SPECS,
        used_by=("native_qwen3", "nki_moe"),
    ),
    TitanName(
        "make_ffn_config",
        "torchtitan.models.common.config_utils",
        _SPECS,
        used_by=("native_qwen3",),
    ),
    TitanName(
        "make_moe_config", "torchtitan.models.common.config_utils", _SPECS, used_by=("nki_moe",)
    ),
    TitanName(
        "make_router_config", "torchtitan.models.common.config_utils", _SPECS, used_by=("nki_moe",)
    ),
    TitanName(
        "make_routed_experts_config",
        "torchtitan.models.common.config_utils",
        _SPECS,
        used_by=("nki_moe",),
    ),
    TitanName(
        "Qwen3Model", "torchtitan.models.qwen3.model", _SPECS, used_by=("native_qwen3", "nki_moe")
    ),
    TitanName(
        "Qwen3TransformerBlock",
        "torchtitan.models.qwen3.model",
        _SPECS,
        used_by=("native_qwen3", "nki_moe"),
    ),
    # --- kernel overrides -------------------------------------------------------------------
    TitanName(
        "override",
        "torchtitan.config",
        "registering the rope_hf / grouped_experts overrides on exactly one config class (exact=True) "
        "and scoped by fqn globs",
        used_by=_OVERRIDES,
        keywords=("target", "fqns", "exact", "description"),
    ),
    TitanName(
        "derive",
        "torchtitan.config",
        "turning a stock CosSinRoPE / GroupedExperts config into the kernel's config, fields kept",
        used_by=_OVERRIDES,
    ),
    TitanName(
        "apply_overrides",
        "torchtitan.config",
        "applying --override specs to the config tree before anything is built",
        used_by=_OVERRIDES,
    ),
    TitanName(
        "OverrideConfig",
        "torchtitan.config",
        "naming the registered override factories for apply_overrides",
        used_by=_OVERRIDES,
        keywords=("imports",),
    ),
    TitanName(
        "_OVERRIDE_REGISTRY",
        "torchtitan.config.override",
        "removing only the suite's own override registrations after use (upstream only offers "
        "clear_overrides(), which drops everyone's)",
        used_by=_OVERRIDES,
        attr="_REGISTRY",
    ),
    TitanName(
        "ModelSpec",
        "torchtitan.protocols.model_spec",
        "finding the model config inside a spec when scoping --override globs",
        used_by=_OVERRIDES,
    ),
    TitanName(
        "_yarn_inv_freq",
        "torchtitan.models.common.rope",
        "rope_hf computes YaRN inverse frequencies exactly as CosSinRoPE does",
        used_by=_ROPE_MODULE,
    ),
    TitanName(
        "_maybe_check_max_pos",
        "torchtitan.models.common.rope",
        "rope_hf refuses positions beyond max_seq_len exactly as CosSinRoPE does",
        used_by=_ROPE_MODULE,
    ),
    TitanName(
        "GroupedExperts",
        "torchtitan.models.common.moe",
        "the routed experts the grouped_experts kernel replaces (same parameters, init and sharding)",
        used_by=("grouped_experts", "nki_moe"),
    ),
    # --- the Transformers modeling backend (tutorial config 1) -------------------------------
    TitanName(
        "transformers_modeling_backend_full",
        f"{_HF_PKG}.config_registry",
        "tutorial config 1 starts from transformers_modeling_backend_full()",
        used_by=_HF,
    ),
    TitanName(
        "HFTransformerModel",
        _HF_PKG,
        "the backend's model, which recipes/hf_compat.py subclasses to work around its defects",
        used_by=_HF,
    ),
    TitanName(
        "HFTransformerModel.Config._configure_hf_attention",
        _HF_PKG,
        "the hook recipes/hf_compat.py overrides to route attention through causal SDPA; if it is "
        "renamed the override is never called and the backend keeps FlexAttention",
        used_by=_HF,
        attr="HFTransformerModel.Config._configure_hf_attention",
        files=("recipes/hf_compat.py",),
    ),
    TitanName(
        "TitanModelConfig", _HF_PKG, "the backend's dense model config (--layers N)", used_by=_HF
    ),
    TitanName(
        "TitanMoeModelConfig",
        _HF_PKG,
        "the backend's MoE model config, without expert bias",
        used_by=_HF,
    ),
    TitanName(
        "HFTransformerStateDictAdapter",
        f"{_HF_PKG}.state_dict_adapter",
        "loading HF MoE checkpoints: recipes/hf_compat.py CompatStateDictAdapter extends it",
        used_by=_HF,
    ),
    # --- Trainer hooks the harness replaces on a built trainer ------------------------------------
    TitanName(
        "Trainer.batch_generator",
        "torchtitan.trainer",
        "recording step 1's batches for the host reference "
        "(Trainer.train must fetch batches through it)",
        attr="Trainer.batch_generator",
        read_by="Trainer.train",
    ),
    TitanName(
        "Trainer.train_step",
        "torchtitan.trainer",
        "injecting a fault at one rank and step (Trainer.train must call it)",
        attr="Trainer.train_step",
        read_by="Trainer.train",
    ),
    TitanName(
        "Trainer attributes",
        "torchtitan.trainer",
        "the trainer state the harness reads or wraps on every rank",
        attr="Trainer.__init__",
        sets=(
            "metrics_processor",
            "step",
            "model_parts",
            "parallel_dims",
            "gradient_accumulation_steps",
            "num_pipeline_parallel_microbatches",
        ),
    ),
    TitanName(
        "MetricsProcessor.logger",
        "torchtitan.components.metrics",
        "recording every step's loss to steps.jsonl "
        "(record_steps wraps metrics_processor.logger; MetricsProcessor.log must use it)",
        attr="MetricsProcessor.__init__",
        sets=("logger",),
        read_by="MetricsProcessor.log",
    ),
    # --- the fork's own recipe (package torchtitan_neuron per the Neuron docs; not public) ---------
    TitanName(
        "qwen3_nki_moe_config",
        "torchtitan_neuron.models.qwen3.config_registry",
        "tutorial config 3 as the "
        'tutorial builds it, qwen3_nki_moe_config("30B-A3B", n_layers=4, num_experts=64, top_k=4); absent, '
        "config 3 is the suite's twin (recipes/nki_moe.py) and the report says so",
        used_by=("nki_moe",),
        keywords=("n_layers", "num_experts", "top_k"),
        required=False,
        files=("recipes/nki_moe.py",),
    ),
    # --- platform ------------------------------------------------------------------------------
    TitanName(
        "device_utils",
        "torchtitan.tools",
        "the cpu tier points torchtitan's device_type / device_module at the CPU before anything else "
        "imports torchtitan (recipes/platform/cpu.py)",
        used_by=("cpu",),
        attr="utils",
    ),
    # --- benchmarks ---------------------------------------------------------------------------
    TitanName(
        "init_logger",
        "torchtitan.tools.logging",
        "printing torchtitan's step lines in the per-recipe benchmark's ranks, as torchtitan.train does",
        used_by=("benchmarks",),
    ),
)
