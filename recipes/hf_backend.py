"""Tutorial config 1: torchtitan's Transformers modeling backend on Qwen3-4B-Instruct-2507.

Starts from ``transformers_modeling_backend_full()`` and sets ``hf_model`` to
``--model-dir`` (trn2 default: ``QWEN3_4B_DIR``), else the tutorial's Hub ID.
The "full" flavor takes every size from that model's config.json, so the cpu
tier trains the fixture checkpoint itself; ``--layers N`` keeps its first N
layers. Data, seq_len, batch, parallelism and checkpoints are the tier's,
shared with native Qwen3 through ``apply_run_options``.

The backend's defects are worked around in ``recipes.hf_compat``; this recipe
only swaps in its spec. ``QWEN3_HF_KEEP_DEFECTS=inv_freq`` keeps upstream's RoPE
init instead, to measure the tutorial as published (``recipes.hf_as_published``).
"""

from __future__ import annotations

import os

from recipes.common import apply_run_options, tier_config
from recipes.options import RunOptions

#: The model tutorial config 1 trains.
HUB_ID = "Qwen/Qwen3-4B-Instruct-2507"

#: ``architectures`` this recipe trains: Qwen3 causal LMs, dense or MoE.
ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


def hf_model(opts: RunOptions) -> str:
    """What the backend reads its config from (and the checkpoint its weights)."""
    return str(opts.model_dir) if opts.model_dir is not None else HUB_ID


def hf_backend(opts: RunOptions):
    """``transformers_modeling_backend_full()`` with ``hf_model`` = ``--model-dir``."""
    from transformers import PretrainedConfig

    from recipes.hf_compat import compat_model_spec
    from recipes.titan import transformers_modeling_backend_full

    config = transformers_modeling_backend_full()
    config.hf_model = hf_model(opts)
    hf_config, _ = PretrainedConfig.get_config_dict(config.hf_model)
    config.model_spec = compat_model_spec(config.model_spec, hf_config, opts.layers)
    if os.environ.get("QWEN3_HF_KEEP_DEFECTS"):
        from recipes.hf_as_published import kept_defects, keep_inv_freq_defect

        if "inv_freq" in kept_defects():
            config.model_spec = keep_inv_freq_defect(config.model_spec, hf_config, opts.layers)
    return apply_run_options(config, opts)


def preflight_check(opts: RunOptions) -> None:
    """Refuse an ``hf_model`` the backend cannot build from, before any rank starts.

    Runs are offline, so ``hf_model`` must be a local directory with a
    config.json describing a Qwen3 causal LM. (Weights for ``--init hf`` are
    checked by ``recipes.preflight.check_model_dir``.)
    """
    from recipes.preflight import PreflightError, read_hf_config

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
            f"recipe 'hf_backend' trains Qwen3 causal LMs ({', '.join(ARCHITECTURES)}): point "
            "--model-dir at a Qwen3 checkpoint"
        )


# --- zero-argument config functions (torchtitan's ``--module recipes.hf_backend --config NAME``) ---


def hf_backend_trn2():
    """Config 1 as the tutorial runs it: ``hf_model`` = ``$QWEN3_4B_DIR``, 64 ranks, DP sharding."""
    return tier_config("hf_backend", "trn2")


def hf_backend_cpu():
    """Config 1 on the cpu tier with the tiny fixture checkpoint as ``hf_model``."""
    return tier_config("hf_backend", "cpu")
