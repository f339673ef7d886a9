"""The recipes this suite reproduces, where each one's config function lives, and the models each accepts."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

#: config.json keys a Qwen3 model is built from, with the type each must have. A missing one is not
#: harmless: transformers (the HF backend, the host reference) fills in its own default, which is
#: not this model's (Qwen3Config: tie_word_embeddings False, head_dim 128, vocab 151936, ...).
#: "a|b.c" means any one of the alternatives, "b.c" a nested key (transformers 5 keeps RoPE theta
#: in rope_parameters; Qwen3-4B-Instruct-2507 has it at the top level).
QWEN3_KEYS = {
    "vocab_size": int,
    "hidden_size": int,
    "intermediate_size": int,
    "num_hidden_layers": int,
    "num_attention_heads": int,
    "num_key_value_heads": int,
    "head_dim": int,
    "max_position_embeddings": int,
    "tie_word_embeddings": bool,
    "rope_theta|rope_parameters.rope_theta": float,
}

#: Qwen3-MoE adds the experts (transformers' Qwen3MoeConfig maps num_experts to num_local_experts).
QWEN3_MOE_KEYS = {
    **QWEN3_KEYS,
    "moe_intermediate_size": int,
    "num_experts|num_local_experts": int,
    "num_experts_per_tok": int,
}

#: config.json ``model_type`` -> (its ``architectures`` class, the keys its model is built from).
MODEL_TYPES = {
    "qwen3": ("Qwen3ForCausalLM", QWEN3_KEYS),
    "qwen3_moe": ("Qwen3MoeForCausalLM", QWEN3_MOE_KEYS),
}


@dataclass(frozen=True)
class Recipe:
    name: str
    module: str
    function: str
    description: str
    #: Which ``--init`` values the recipe supports; the shrunk MoE has no published weights.
    inits: tuple[str, ...] = ("hf", "random")
    #: config.json ``model_type`` values whose weights the recipe trains (keys of ``MODEL_TYPES``).
    model_types: tuple[str, ...] = ("qwen3",)
    #: The model is whatever --model-dir's config.json describes, with any ``--init`` (the HF backend);
    #: otherwise the recipe builds its own model and reads config.json only to load weights.
    builds_from_config: bool = False

    def config_fn(self):
        return getattr(importlib.import_module(self.module), self.function)

    def reads_config(self, init: str) -> bool:
        """Whether a run with ``--init init`` reads --model-dir's config.json (its model or its weights)."""
        return self.builds_from_config or init == "hf"


RECIPES = {
    r.name: r
    for r in (
        Recipe(
            "native_qwen3",
            "recipes.native_qwen3",
            "native_qwen3",
            "tutorial config 2: qwen3_32b() with model_registry('4B', attn_backend='sdpa')",
        ),
        Recipe(
            "hf_backend",
            "recipes.hf_backend",
            "hf_backend",
            "tutorial config 1: transformers_modeling_backend_full() with hf_model = --model-dir",
            model_types=("qwen3", "qwen3_moe"),
            builds_from_config=True,
        ),
        Recipe(
            "nki_moe",
            "recipes.nki_moe",
            "nki_moe",
            "tutorial config 3: 30B-A3B shrunk to 4 layers/64 experts/top-4, NKI grouped experts, eager",
            inits=("random",),
            model_types=("qwen3_moe",),
        ),
    )
}


#: The recipe a run names when it names none (``harness.options.run_options.RunOptions``): tutorial config 2.
DEFAULT_RECIPE = "native_qwen3"


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise KeyError(name)
    return RECIPES[name]
