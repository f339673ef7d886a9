"""The tutorial's published numbers and pins: the claims this suite reproduces.

This is the one place the tutorial's numbers are written: goldens files name a
claim (lanes ``published`` and ``proxy``) and take its value from here. Values are
as published, to the precision published.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    key: str
    value: object
    what: str


SOURCE = (
    "AWS Machine Learning Blog (Amazon Web Services), tutorial by Josh Longenecker: training Qwen3 "
    "with torchtitan on a single trn2.48xlarge (Transformers v5 backend, native Qwen3, NKI MoE)"
)

CLAIMS = {
    c.key: c
    for c in (
        Claim("step1_loss_hf", 6.54, "step-1 loss, Qwen3-4B-Instruct-2507 published weights"),
        Claim("step1_loss_random", 12.43, "step-1 loss, random init (Qwen3-4B width/vocab)"),
        Claim("rope_q_max_abs_diff", 0.0, "rope_hf vs torchtitan RoPE, float32, q"),
        Claim("rope_k_max_abs_diff", 0.0, "rope_hf vs torchtitan RoPE, float32, k"),
        Claim("export_missing_keys", ["lm_head.weight"], "HF export load_state_dict missing keys (tied)"),
        Claim("export_unexpected_keys", [], "HF export load_state_dict unexpected keys"),
    )
}

PINS = {
    "torch": "2.14.0",
    "torch-neuronx": "2.14.3",
    "transformers": "5.16.0",
    "torchtitan-neuron": "release-2.33 (0.2.2+neuron.1)",
}
