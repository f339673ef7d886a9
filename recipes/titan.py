"""Every torchtitan name the suite depends on, imported here and nowhere else.

Two torchtitans run the suite: upstream 0.3.0 (PyPI) on cpu, and on trn2 torchtitan-neuron
release-2.33, a fork installed with ``pip install -e .`` as the distribution ``torchtitan``
0.2.2+neuron.1 (Neuron docs: training/torchtitan/get-started/setup-torchtitan-neuron). Each
name is declared once in :data:`NAMES` with its module, why the suite needs it and who uses
it, so a torchtitan that lacks one is refused in one line before any rank starts: the
harness's checks refuse a run whose names are :func:`missing`, ``python -m harness.checks.titan``
lists them as the nightly's first step and in the dry run (every name, each missing one with its files).

Hooks too: attributes the harness replaces on a built trainer (``batch_generator``,
``train_step``, ``metrics_processor.logger``). A renamed hook fails no import, the
replacement is just never called, so each is declared with the code that must call it
(``read_by``) or the ``__init__`` that must assign it (``sets``), checked in the bytecode,
and replaced only through :func:`wrap_hook`, which checks it again on the rank.

And one name of tyro, torchtitan's CLI parser: its parse-error hook (``on_parse_error``).

Which upstream the fork is. In pytorch/torchtitan (git log -S on main, read up to
2026-08-21) the newest names here appeared 2026-06-05..07-20: ``CosSinRoPE`` 02d24f017,
``derive``/``override(exact=)`` adf340d3f (06-10), ``ChunkedLossWrapper`` 9530a874d (06-26),
``_yarn_inv_freq`` 51c197c86 (07-10), ``_configure_hf_attention`` af35cfb15 (07-20); two
vanished on 2026-08-19: ``torchtitan.components.checkpoint`` (2e92be1c4) and
``HuggingFaceTextDataLoader`` (1b04fc1c3). version.txt read 0.2.2 throughout, so
"0.2.2+neuron.1" does not date the fork's base; only the check against the installed fork
does. Open question (checked: the Neuron 2.33 release notes; the fork is not public here):
which upstream commit release-2.33 is based on.

Nothing is imported when this module is: each name imports its own module on first use
(PEP 562 ``__getattr__``: ``from recipes.titan import CosSinRoPE``), so ``recipes.platform``
can patch torchtitan first, and a recipe without kernels never imports a kernel's module.
"""

from __future__ import annotations

import contextlib
import dis
import importlib
import importlib.metadata
import inspect
from collections.abc import Iterable
from dataclasses import dataclass

from recipes.errors import RecipeError

#: ``used_by`` tag for names every recipe needs.
EVERY_RUN = "every run"


class TitanNameError(RecipeError):
    """The installed torchtitan lacks a name the suite depends on."""


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

BY_NAME: dict[str, TitanName] = {n.name: n for n in NAMES}


def installed_version(distribution: str = "torchtitan") -> str:
    """The installed distribution's version (``importlib.metadata``)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def _missing(entry: TitanName, what: str) -> TitanNameError:
    package = "tyro" if entry.module.partition(".")[0] == "tyro" else "torchtitan"
    if not entry.required:
        return TitanNameError(
            f"{package} {installed_version(package)} has no {what}: {entry.purpose}"
        )
    return TitanNameError(
        f"torchtitan {installed_version()} has no {what}, which the suite needs for {entry.purpose}. "
        "Install the torchtitan the suite pins (cpu: requirements-lock.txt; trn2: torchtitan-neuron "
        "release-2.33), or adapt recipes/titan.py and its callers to this version"
    )


def _import(entry: TitanName):
    try:
        return importlib.import_module(entry.module)
    except ImportError as e:
        raise _missing(entry, f"{entry.qualified} (importing {entry.module} failed: {e})") from None


def _check_keywords(entry: TitanName, obj) -> None:
    target = obj
    for part in filter(None, entry.keywords_of.split(".")):
        target = getattr(target, part, None)
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        raise _missing(entry, f"inspectable signature for {entry.qualified}") from None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    absent = [k for k in entry.keywords if k not in params]
    if absent:
        callee = ".".join(filter(None, (entry.qualified, entry.keywords_of)))
        raise _missing(entry, f"keyword {absent[0]!r} in {callee}(...)")


def _walk(obj, path: str, entry: TitanName, shown: str):
    for part in path.split("."):
        if not hasattr(obj, part) and inspect.ismodule(obj):
            # A submodule is an attribute only once something imported it.
            with contextlib.suppress(ImportError):
                importlib.import_module(f"{obj.__name__}.{part}")
        if not hasattr(obj, part):
            raise _missing(entry, shown)
        obj = getattr(obj, part)
    return obj


def _instructions(function):
    """Every bytecode instruction of ``function`` (decorators unwrapped), nested functions included."""
    code = getattr(inspect.unwrap(function), "__code__", None)
    stack = [code] if code is not None else []
    while stack:
        code = stack.pop()
        yield from dis.get_instructions(code)
        stack += [c for c in code.co_consts if inspect.iscode(c)]


def _check_hook(entry: TitanName, module, obj) -> None:
    """``sets``: ``obj`` assigns each attribute; ``read_by``: that code reads the hook's last name part."""
    if entry.sets:
        assigned = {i.argval for i in _instructions(obj) if i.opname == "STORE_ATTR"}
        absent = [name for name in entry.sets if name not in assigned]
        if absent:
            raise _missing(entry, f"assignment self.{absent[0]} in {entry.qualified}")
    if entry.read_by:
        reader = _walk(module, entry.read_by, entry, f"{entry.module}.{entry.read_by}")
        attribute = entry.name.rsplit(".", 1)[-1]
        if attribute not in {
            i.argval for i in _instructions(reader) if i.opname in ("LOAD_ATTR", "LOAD_METHOD")
        }:
            raise _missing(
                entry,
                f"read of self.{attribute} in {entry.module}.{entry.read_by} (a hook it no longer calls)",
            )


def resolve(entry: TitanName):
    """The object ``entry`` names, or :class:`TitanNameError` saying what is missing and why it matters."""
    module = _import(entry)
    obj = _walk(module, entry.attr or entry.name, entry, entry.qualified)
    if entry.keywords:
        _check_keywords(entry, obj)
    if entry.sets or entry.read_by:
        _check_hook(entry, module, obj)
    return obj


def hook(owner, name: str, wrapped_by: str = ""):
    """The declared hook ``name`` (``"Trainer.batch_generator"``) as the built ``owner`` holds it.

    Checked as the names check checks it (present, still called or assigned by torchtitan),
    so a fork without it fails on the rank in one line naming the hook and the module
    that wraps it (``wrapped_by``), never an AttributeError or a wrapper never called (no step-1 record, so
    a reference loss silently absent).
    """
    entry = BY_NAME.get(name)
    if entry is None or not (entry.read_by or entry.sets) or "." not in name:
        raise AttributeError(
            f"{name!r} is no hook of recipes.titan.NAMES; declare it there with read_by= or sets="
        )
    attribute = name.rsplit(".", 1)[-1]
    try:
        resolve(entry)
        if not hasattr(owner, attribute):
            raise _missing(entry, f"{attribute} on the built {type(owner).__qualname__}")
    except TitanNameError as e:
        raise TitanNameError(
            f"{e}; the hook is wrapped by {wrapped_by}" if wrapped_by else str(e)
        ) from None
    return getattr(owner, attribute)


def wrap_hook(owner, name: str, wrap) -> None:
    """Replace the declared hook ``name`` on ``owner`` by ``wrap(original)`` (checked by :func:`hook`).

    A hook that is gone is refused naming ``wrap``'s module, the code that relies on it.
    """
    setattr(
        owner,
        name.rsplit(".", 1)[-1],
        wrap(hook(owner, name, getattr(wrap, "__module__", None) or "")),
    )


def entries(used_by: Iterable[str] = (EVERY_RUN,)) -> list[TitanName]:
    """The declared names one of ``used_by`` needs (required or not), in declaration order."""
    tags = set(used_by)
    return [entry for entry in NAMES if tags.intersection(entry.used_by)]


def missing(used_by: Iterable[str] = (EVERY_RUN,)) -> list[TitanNameError]:
    """Every required name one of ``used_by`` needs that the installed torchtitan lacks."""
    errors = []
    for entry in entries(used_by):
        if not entry.required:
            continue
        try:
            resolve(entry)
        except TitanNameError as e:
            errors.append(e)
    return errors


def optional(name: str):
    """A ``required=False`` name, or ``(None, why)`` when the installed packages lack it: ``(obj, "")``."""
    try:
        return resolve(BY_NAME[name]), ""
    except TitanNameError as e:
        return None, str(e)


def run_tags(recipe: str, overrides: Iterable[str] = (), tier: str = "") -> set[str]:
    """The ``used_by`` tags of one run: every run's, the tier's, the recipe's, and each ``--override``'s.

    Nothing is imported: a recipe's own kernels are declared in :data:`NAMES`
    (``used_by`` names the recipe), so a fork that breaks a kernel module's import
    is refused here, not by a traceback.
    """
    return {EVERY_RUN, recipe, tier, *(str(spec).partition("=")[0].strip() for spec in overrides)}


def __getattr__(name: str):
    entry = BY_NAME.get(name)
    if entry is None:
        raise AttributeError(
            f"module {__name__!r} has no attribute {name!r}; declare it in recipes.titan.NAMES"
        )
    value = resolve(entry)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(BY_NAME))
