"""The run's peak host memory per rank, estimated from the built config and weighed against the host before launch.

Only where the ranks run on the host CPU: the cpu tier, and a rehearsal of the trn2 night (stand-in
Neuron packages, ``$QWEN3_REHEARSAL_SETTINGS``). On trn2 the model lives in the device's memory, not
the host's, and nothing is weighed here.

Per rank, in bytes (fp32 on cpu: ``training.mixed_precision_param``), tokens = local_batch_size x seq_len:

* parameters: every parameter of the model built on the meta device (FSDP gathers them whole for the
  forward, and the checkpoint is read whole), x param bytes;
* gradients: the same count x 4, sharded over the FSDP ranks; none for a forward-only run;
* AdamW states: 2 x the count x 4, sharded over the FSDP ranks; none for a forward-only run;
* activations: tokens x layers x (8 x hidden + 2 x FFN width + heads x seq_len) x 4 (the FFN width is
  ``intermediate_size``, or ``moe_intermediate_size`` x top-k); a forward-only run keeps one layer's;
* logits: tokens x vocab x param bytes, plus its fp32 softmax and gradient copies (one copy, the softmax,
  for a forward-only run);
* runtime: :data:`RUNTIME_BYTES`, the interpreter with torch and torchtitan imported.

Calibration (2026-12-07, this 2-core host; the peak RSS ``VmHWM`` of each rank process, polled while
``python -m harness run RECIPE --tier cpu --steps 2`` for config 2, ran): the defaults (2 ranks, batch 2 x seq 256,
the tiny fixture) measured 0.67 GB per rank, estimated 0.67 GB; ``--init hf --local-batch-size 200``
measured 2.18 GB (rank 0; rank 1 1.99), estimated 2.44 GB; the 4B-width random-init proxy (1 layer,
vocab 151936, seq 2048, forward-only, 1 rank) measured 6.05 GB, estimated 5.96 GB. The issue's
``--local-batch-size 5000`` (estimated 45.2 GB per rank, 90.4 GB for 2 ranks) was OOM-killed at 11.5 GB
resident on rank 0 after 226 s; it is now refused before launch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from harness.checks.errors import PreflightError
from harness.options.run_options import RunOptions
from recipes.tiers import REHEARSAL_SETTINGS_ENV

GB = 1e9
#: A rank with python, torch and torchtitan imported, before its model: the default tiny run's 0.67 GB
#: peak per rank less its estimated terms (0.02 GB).
RUNTIME_BYTES = int(0.65 * GB)
#: Activations per token and layer, in fp32 values: hidden states and FFN widths a layer keeps for its
#: backward (calibrated above), and one attention row per head.
ACT_HIDDEN, ACT_FFN = 8, 2
MEMINFO = Path("/proc/meminfo")
CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)


@dataclass(frozen=True)
class Estimate:
    terms: dict[str, float]  # name -> bytes per rank
    per_row: float  # bytes per rank for each row of local_batch_size
    ranks: int
    vocab: int

    @property
    def per_rank(self) -> float:
        return sum(self.terms.values())

    @property
    def total(self) -> float:
        return self.per_rank * self.ranks


def on_host(opts: RunOptions) -> bool:
    """The ranks run on this host's CPU: the cpu tier, or a cpu rehearsal of the trn2 night."""

    return opts.tier == "cpu" or bool(os.environ.get(REHEARSAL_SETTINGS_ENV))


def shape(config) -> dict:
    """Parameters, layers, hidden size, FFN width per token, attention heads and vocab of the built model."""
    from harness.checks.mismatch import built_dims  # noqa: PLC0415 -- heavy: harness.checks.mismatch imports torch (torch 2.9 s); this module stays light

    dims = built_dims(config)
    if hasattr(config, "hf_model"):  # the HF backend: what config.json describes, its --layers kept
        from recipes.specs import read_hf_dims  # noqa: PLC0415 -- heavy: recipes.specs imports torch (torch 2.9 s); this module stays light

        hf = read_hf_dims(Path(config.hf_model))
        top_k = hf.get("num_experts_per_tok")
        ffn = hf["moe_intermediate_size"] * top_k if top_k else hf.get("intermediate_size", 0)
        params = hf_parameters(Path(config.hf_model), dims["num_hidden_layers"])
    else:
        import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light

        layer = config.model_spec.model.layers[0]
        if layer.moe is not None:
            moe = layer.moe.routed_experts
            ffn = moe.inner_experts.hidden_dim * moe.token_dispatcher.top_k
        else:
            ffn = layer.feed_forward.w1.out_features
        with torch.device("meta"):
            params = sum(p.numel() for p in config.model_spec.model.build().parameters())
    return {
        "params": params,
        "layers": dims["num_hidden_layers"],
        "hidden": dims["hidden_size"],
        "ffn": ffn,
        "heads": dims["num_attention_heads"],
        "vocab": dims["vocab_size"],
    }


def hf_parameters(model_dir: Path, layers: int) -> int:
    """The parameter count of transformers' model of ``model_dir``'s config.json with ``layers`` layers (meta)."""
    import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415 -- heavy: transformers 1.8 s; this module stays light

    hf = AutoConfig.from_pretrained(model_dir)
    hf.num_hidden_layers = layers
    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(hf).parameters())


def fsdp_degree(opts: RunOptions, config) -> int:
    p = config.parallelism
    if p.data_parallel_shard_degree > 0:
        return p.data_parallel_shard_degree
    others = (
        p.tensor_parallel_degree
        * p.context_parallel_degree
        * p.pipeline_parallel_degree
        * p.data_parallel_replicate_degree
    )
    return max(opts.nproc * opts.nnodes // max(others, 1), 1)


def estimate(opts: RunOptions, config) -> Estimate:
    """Each term of one rank's peak host memory (module docstring), in bytes."""
    from recipes.titan import TORCH_DTYPE_MAP  # noqa: PLC0415 -- heavy: recipes.titan imports torchtitan (torchtitan+torch 2.9 s); this module stays light

    m = shape(config)
    width = TORCH_DTYPE_MAP[config.training.mixed_precision_param].itemsize
    seq, rows = config.training.seq_len, config.training.local_batch_size
    train = not opts.forward_only
    shards = fsdp_degree(opts, config)
    kept_layers = m["layers"] if train else 1
    act_row = (
        seq * kept_layers * (ACT_HIDDEN * m["hidden"] + ACT_FFN * m["ffn"] + m["heads"] * seq) * 4
    )
    logits_row = seq * m["vocab"] * (width + 4 * (2 if train else 1))
    terms = {
        "parameters": m["params"] * width,
        "gradients": m["params"] * 4 / shards if train else 0,
        "AdamW states": 2 * m["params"] * 4 / shards if train else 0,
        "activations": rows * act_row,
        "logits": rows * logits_row,
        "runtime": RUNTIME_BYTES,
    }
    return Estimate(terms, act_row + logits_row, opts.nproc, m["vocab"])


def host_available() -> tuple[float, str]:
    """The memory this host can give: MemAvailable, or the cgroup's limit when smaller; and what said so."""
    found = []
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append((int(line.split()[1]) * 1024, f"MemAvailable in {MEMINFO}"))
    except (OSError, ValueError):
        pass
    for path in CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # "max" or v1's "unlimited" page-rounded 2^63
            found.append((int(text), f"the cgroup limit {path}"))
    return min(found) if found else (float("inf"), "nothing")


def check_memory(opts: RunOptions, config) -> str | None:
    """Refuse a run whose ranks' estimated peak exceeds what the host has available; the estimate, for the dry run."""
    if not on_host(opts):
        return None
    est = estimate(opts, config)
    available, source = host_available()
    t = config.training
    figures = ", ".join(f"{name} {value / GB:.2f}" for name, value in est.terms.items())
    said = (
        f"--local-batch-size {t.local_batch_size} (x seq_len {t.seq_len} x vocab {est.vocab}) needs about "
        f"{est.per_rank / GB:.1f} GB per rank ({figures} GB) x {est.ranks} rank(s) = {est.total / GB:.1f} GB"
    )
    if est.total <= available:
        return f"memory: {said}, of {available / GB:.1f} GB available ({source})"
    fixed = est.per_rank - t.local_batch_size * est.per_row
    fits = int((available / est.ranks - fixed) // est.per_row)
    fix = (
        f"choose --local-batch-size {fits} or less, or run fewer ranks (--nproc)"
        if fits >= 1
        else f"not one row fits: the model and runtime alone need {fixed / GB:.2f} GB per rank; choose fewer "
        "--layers or fewer ranks (--nproc)"
    )
    raise PreflightError(
        f"{said}, more than the {available / GB:.1f} GB this host has available ({source}): the kernel's OOM "
        f"killer would end a rank mid-run; {fix}"
    )
