"""What the reference costs at the real 4B width on this CPU, measured, and extrapolated to a trn2 batch."""

from __future__ import annotations

import gc
import resource
import time
from pathlib import Path

from harness.base.environment import cpu_model
from harness.declare import catalogue
from harness.options.run_options import RunOptions
from harness.reference.scoring import batch_loss

#: A trn2 global batch at the tutorial's launch: 64 ranks × local batch 1 × 2048 tokens.
TRN2_GLOBAL_ROWS = 64


def measure_cost(
    config_dir: Path,
    layers: tuple[int, ...] = (1, 2),
    seq_len: int = 2048,
    threads: int | None = None,
) -> dict:
    """Host CPU time and memory of the reference at the real width, measured, then extrapolated.

    Random weights at ``layers`` depths: two depths separate the per-layer cost from the
    fixed one (embedding, final norm, the 151,936-row head), so a 2048-token row of the
    full model costs ``fixed + n_layers × per_layer``. CPU seconds, not wall time, are
    the figure to scale (other processes on a shared machine stretch wall time).
    The full model's fp32 size is counted on the meta device.
    """

    import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415 -- heavy: transformers 1.8 s; this module stays light

    if threads:
        torch.set_num_threads(threads)
    full = AutoConfig.from_pretrained(config_dir)
    with torch.device("meta"):
        full_params = sum(p.numel() for p in AutoModelForCausalLM.from_config(full).parameters())
    measured = {}
    for n in layers:
        config, model = truncated_model(config_dir, n)
        ids = torch.randint(0, config.vocab_size, (1, seq_len))
        batch = {
            "input": ids,
            "positions": torch.arange(seq_len)[None],
            "labels": torch.roll(ids, -1, 1),
        }
        batch_loss(model, [batch], "causal")  # warm-up
        started, cpu = time.perf_counter(), time.process_time()
        batch_loss(model, [batch], "causal")
        measured[n] = {"wall_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu}
        del model
        gc.collect()
    a, b = layers[0], layers[-1]
    per_layer = (measured[b]["cpu_s"] - measured[a]["cpu_s"]) / (b - a)
    fixed = measured[a]["cpu_s"] - a * per_layer
    per_row = fixed + full.num_hidden_layers * per_layer
    return {
        "config": str(config_dir),
        "seq_len": seq_len,
        "threads": torch.get_num_threads(),
        "cpu_model": cpu_model(),
        "by_layers": measured,
        "per_row_fixed_cpu_s": fixed,
        "per_row_per_layer_cpu_s": per_layer,
        "full_layers": full.num_hidden_layers,
        "per_row_full_model_cpu_s": per_row,
        "trn2_global_batch_rows": TRN2_GLOBAL_ROWS,
        "trn2_global_batch_cpu_hours": per_row * TRN2_GLOBAL_ROWS / 3600,
        "full_model_params": full_params,
        "full_model_fp32_gib": full_params * 4 / 2**30,
        "peak_rss_gib_here": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def measure_localize_cost(
    config_dir: Path,
    layers: tuple[int, ...] = (1, 2),
    tokens: int = 256,
    threads: int | None = None,
) -> dict:
    """The localizer (harness.reference.localize) at the real width: random weights at two depths, extrapolated.

    CPU seconds of building the run's torchtitan model and comparing one row of ``tokens``
    positions (both forwards, transformers' debugger files, the comparisons), and the bytes
    the debugger wrote; per layer from the two depths, then ``fixed + n_layers × per_layer``.
    transformers' model itself is not counted: the reference check has loaded it already.
    """

    import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light
    from transformers import AutoConfig  # noqa: PLC0415 -- heavy: transformers 1.8 s; this module stays light

    from harness.config.build import build_config  # noqa: PLC0415 -- heavy: harness.config.build imports torch (torch 2.9 s); this module stays light
    from harness.reference.localize import localize, titan_model  # noqa: PLC0415 -- heavy: harness.reference.localize imports torch (torch 2.9 s); this module stays light

    if threads:
        torch.set_num_threads(threads)
    full = AutoConfig.from_pretrained(config_dir)
    theta = (getattr(full, "rope_parameters", None) or {}).get("rope_theta")

    def options(n: int) -> RunOptions:
        return RunOptions(
            recipe=catalogue.localized(),
            tier="cpu",
            init="hf",
            layers=n,
            model_dir=Path(config_dir),
            rope_theta=theta,
        ).resolved()

    build_config(options(layers[0]))  # warm-up: the first build imports torchtitan and the recipes
    measured = {}
    for n in layers:
        config, hf = truncated_model(config_dir, n)
        opts = options(n)
        started, cpu = time.perf_counter(), time.process_time()
        titan, _ = titan_model(opts, hf.state_dict())
        built_cpu = time.process_time() - cpu
        loc = localize(titan, hf, torch.randint(0, config.vocab_size, (1, tokens)))
        measured[n] = {
            "wall_s": time.perf_counter() - started,
            "cpu_s": time.process_time() - cpu,
            "build_cpu_s": built_cpu,
            "debugger_bytes": loc.cost["debugger_bytes"],
            "first_divergence": loc.summary()[:200],
        }
        del hf, titan, loc
        gc.collect()
    a, b = layers[0], layers[-1]
    extrapolated = {}
    for key in ("cpu_s", "debugger_bytes"):
        per_layer = (measured[b][key] - measured[a][key]) / (b - a)
        extrapolated[key] = {
            "fixed": measured[a][key] - a * per_layer,
            "per_layer": per_layer,
            "full_model": measured[a][key] + (full.num_hidden_layers - a) * per_layer,
        }
    return {
        "config": str(config_dir),
        "tokens": tokens,
        "threads": torch.get_num_threads(),
        "by_layers": measured,
        "full_layers": full.num_hidden_layers,
        "extrapolated": extrapolated,
        "peak_rss_gib_here": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def truncated_model(config_dir, layers: int):
    """``config_dir``'s model cut to its first ``layers`` blocks, random (seed 0), fp32, eval: what a cost is measured on."""
    import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415 -- heavy: transformers 1.8 s; this module stays light

    config = AutoConfig.from_pretrained(config_dir)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    torch.manual_seed(0)
    return config, AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
