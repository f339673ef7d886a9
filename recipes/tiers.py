"""Tier presets: what differs between the cpu tier and a trn2.48xlarge.

A recipe reads its sizes, process count, data and dtype from here, so the
recipe modules stay a single description of the tutorial's configuration.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "fixtures"


@dataclass(frozen=True)
class DenseDims:
    """Qwen3 dense hyper-parameters, named as in Qwen3's config.json."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool = True
    rms_norm_eps: float = 1e-6


@dataclass(frozen=True)
class MoEDims(DenseDims):
    """Qwen3-MoE hyper-parameters (``moe_intermediate_size``, experts, top-k)."""

    moe_intermediate_size: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    norm_topk_prob: bool = True


#: The fixture checkpoint (fixtures/qwen3-tiny): a Qwen3 small enough for 2 CPU cores.
TINY_DENSE = DenseDims(
    vocab_size=1024,
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=384,
    rope_theta=1_000_000.0,
    max_position_embeddings=4096,
)

#: Qwen3-30B-A3B shrunk to 4 layers / 64 experts / top-4 with tiny widths (cpu tier).
TINY_MOE = MoEDims(
    **{**asdict(TINY_DENSE), "num_hidden_layers": 4, "tie_word_embeddings": False},
    moe_intermediate_size=64,
    num_experts=64,
    num_experts_per_tok=4,
)


@dataclass(frozen=True)
class Tier:
    """Everything a recipe needs to know about where it runs."""

    name: str
    nproc: int
    seq_len: int
    local_batch_size: int
    steps: int
    #: None on trn2 until QWEN3_DATASET_DIR is set: the run is refused then (preflight), never
    #: silently trained on the fixture corpus.
    dataset_path: Path | None
    tokenizer_dir: Path
    model_dir: Path | None
    warmup_steps: int
    deterministic: bool
    #: FSDP mixed-precision parameter dtype: fp32 on cpu keeps 1- and 2-process runs and HF parity exact.
    param_dtype: str
    #: Wall-clock limit of one launch (harness.launch.lifecycle) and of a shared test run (conftest).
    launch_timeout_s: float
    #: The tutorial's full-size models (4B, 30B-A3B shrunk to 4 layers); else the tiny fixture dims.
    full_size_models: bool
    #: Whether a recipe's ``compile.enable`` stands; cpu runs eager (compile time would dwarf
    #: the tiny runs, and the goldens were measured eager).
    compile_allowed: bool
    #: ``compile.backend`` where compile runs: torch.compile's TorchDynamo backend for this device.
    compile_backend: str
    #: The HF export's dtype: fp32 on cpu so export and trained state compare bitwise,
    #: bf16 on trn2 like the published weights.
    export_dtype: str
    #: Whether enabled NKI kernels run here (their shape rules are then checked before launch).
    runs_nki_kernels: bool
    #: How torchrun's ranks start: "exec" (torchrun itself: each rank a fresh interpreter that
    #: imports torch and torchtitan) or "preloaded" (harness.launch.elastic: torchrun's parser and torch
    #: elastic, ranks forked from a forkserver that imported them once, while the launcher checks).
    rank_start: str = "exec"
    extra_env: dict[str, str] = field(default_factory=dict)
    #: The MoE this tier builds where it does not build the full-size models.
    tiny_moe: MoEDims = TINY_MOE

    def tokenizer_for(self, model_dir: Path | None) -> Path:
        """The tokenizer a run uses unless told otherwise: its weights' own, else the tier's."""
        return model_dir or self.tokenizer_dir


#: Test switch: how the cpu tier's ranks start, "exec" or "preloaded" (unset: the tier's own,
#: "preloaded"). The lifecycle and fault tests run each case on both paths with it; trn2 keeps
#: the tutorial's "exec" (forking ranks after a Neuron import is unverified).
RANK_START_ENV = "QWEN3_RANK_START"
RANK_STARTS = ("exec", "preloaded")


def _rank_start(default: str) -> str:
    """``$QWEN3_RANK_START`` if set, else ``default``.

    Any other value is kept as it is and refused when a run uses it (``rank_start_problem``), not
    at import: ``python -m harness list`` and ``--help`` import this module and must still work.
    """
    return os.environ.get(RANK_START_ENV) or default


def rank_start_problem(tier: "Tier") -> str | None:
    """Why ``tier``'s ranks cannot start as ``$QWEN3_RANK_START`` says, naming the fix; None when they can."""
    if tier.rank_start in RANK_STARTS:
        return None
    return f"{RANK_START_ENV}={tier.rank_start!r} is not a way to start ranks; use one of {', '.join(RANK_STARTS)}, or unset it"


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


CPU = Tier(
    name="cpu",
    nproc=2,
    seq_len=256,
    local_batch_size=2,
    steps=5,
    dataset_path=FIXTURES / "corpus",
    tokenizer_dir=FIXTURES / "qwen3-tiny",
    model_dir=FIXTURES / "qwen3-tiny",
    warmup_steps=2,
    deterministic=True,
    param_dtype="float32",
    # Tiny models: startup 20-40 s per torchrun launch, well under a second per step; on a
    # shared 2-core machine several launches may run at once.
    launch_timeout_s=900,
    full_size_models=False,
    compile_allowed=False,
    compile_backend="inductor",
    export_dtype="float32",
    runs_nki_kernels=False,
    # A tiny run is mostly start-up: nproc imports of torch+torchtitan (~9 s of CPU each) cost
    # more than its steps; forked from one preloaded server they cost one.
    # $QWEN3_RANK_START=exec starts them as trn2 does (the tests run both paths).
    rank_start=_rank_start("preloaded"),
    extra_env={"OMP_NUM_THREADS": "1"},
)

#: trn2.48xlarge at LNC=2: 16 Trainium2 chips = 64 logical NeuronCores, one rank each.
TRN2 = Tier(
    name="trn2",
    nproc=64,
    seq_len=2048,
    local_batch_size=1,
    steps=10,
    dataset_path=_env_path("QWEN3_DATASET_DIR"),
    tokenizer_dir=_env_path("QWEN3_4B_DIR") or Path("QWEN3_4B_DIR-is-not-set"),
    model_dir=_env_path("QWEN3_4B_DIR"),
    warmup_steps=600,
    deterministic=False,
    param_dtype="bfloat16",
    # Eager TorchNeuron compiles every new op/kernel shape on first call; with a cold NEFF
    # cache a 64-rank run spends many minutes compiling before step 1, then loads a 4B
    # checkpoint on every rank. Two hours bounds a hung collective without failing a cold run.
    launch_timeout_s=7200,
    full_size_models=True,
    compile_allowed=True,
    # TorchNeuron's TorchDynamo backend; torchtitan's default, inductor, does not target Neuron:
    # "--compile.enable --compile.backend neuron" (aws-neuron/aws-neuron-sdk
    # training/torchtitan/about-torchtitan-neuron.rst; torch/compile/reference-torch-compile.rst:
    # torch.compile(model, backend="neuron")).
    compile_backend="neuron",
    export_dtype="bfloat16",
    runs_nki_kernels=True,
    # The tutorial's own launch: forking ranks after a Neuron import is unverified, and a
    # 64-rank run's start-up is small beside its NEFF compiles.
    rank_start="exec",
    extra_env={"NEURON_LOGICAL_NC_CONFIG": "2"},
)

#: ``QWEN3_REHEARSAL_SETTINGS=<json>``: the cpu rehearsal of the trn2 night (rehearsal/settings.py, loaded by
#: path: the product never imports the rehearsal). Its loader refuses to act on a host with a real /dev/neuron*.
REHEARSAL_SETTINGS_ENV = "QWEN3_REHEARSAL_SETTINGS"


def rehearsal_settings():
    """The rehearsal's settings (``rehearsal.settings.RehearsalSettings``) when ``$QWEN3_REHEARSAL_SETTINGS``
    is set, else None. The one seam between the night's code and its cpu rehearsal."""
    if not os.environ.get(REHEARSAL_SETTINGS_ENV):
        return None
    name = "_qwen3_rehearsal_settings"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "rehearsal" / "settings.py")
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module.load()


#: What a rehearsal writes on every value it records (report, runs log, trend): never a trn2 result.
REHEARSAL_MARK = "rehearsal: stand-in Neuron packages on cpu, never a trn2 result"


def rehearsal_mark() -> dict[str, str]:
    """``{"rehearsal": REHEARSAL_MARK}`` in a rehearsal, ``{}`` otherwise: merged into every record it writes."""
    return {"rehearsal": REHEARSAL_MARK} if os.environ.get(REHEARSAL_SETTINGS_ENV) else {}


def rehearsed(tier: Tier) -> Tier:
    """``tier`` as the cpu rehearsal runs the night: the seam's rank count and tiny models (the fixture
    weights stand in for Qwen3-4B), the MoE at the smallest hidden size nkilib's MoE kernels take
    (512: H % 512 == 0, aws-neuron/nki-library moe_cte's shape checks), seq_len 256 (128 x LNC 2).
    Without settings, ``tier`` itself."""
    settings = rehearsal_settings()
    if settings is None:
        return tier
    sizes = settings.sizes
    return replace(
        tier,
        nproc=settings.ranks,
        seq_len=sizes.get("seq_len", 256),
        local_batch_size=sizes.get("local_batch_size", 1),
        launch_timeout_s=sizes.get("launch_timeout_s", 1200),
        full_size_models=False,
        tiny_moe=replace(TINY_MOE, hidden_size=sizes.get("moe_hidden_size", 512)),
    )


def launch_seq_len(seq_len: int | None) -> int | None:
    """A night's launch's own sequence length (``harness.declare.catalogue.Launch.seq_len``); in a rehearsal the seam's,
    as every launch there runs at tiny sizes (config 3's rope_hf launch pins trn2's 2048, which the stand-in
    device would take 3x longer over than the seam's 256; both are multiples of 128 x LNC)."""
    return TRN2.seq_len if seq_len and rehearsal_settings() is not None else seq_len


#: Each tier as published, before any rehearsal shrinks it: what the tutorial's own calls build (meta-only
#: descriptions such as config 3's fork-vs-twin comparison), whatever sizes the launches take.
AS_PUBLISHED = {t.name: t for t in (CPU, TRN2)}

TRN2 = rehearsed(TRN2)

TIERS = {t.name: t for t in (CPU, TRN2)}
