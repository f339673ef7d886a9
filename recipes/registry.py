"""The recipes this suite reproduces, and where each one's config function lives."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    name: str
    module: str
    function: str
    description: str
    #: Which ``--init`` values the recipe supports; the shrunk MoE has no published weights.
    inits: tuple[str, ...] = ("hf", "random")

    def config_fn(self):
        return getattr(importlib.import_module(self.module), self.function)


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
        ),
        Recipe(
            "nki_moe",
            "recipes.nki_moe",
            "nki_moe",
            "tutorial config 3: 30B-A3B shrunk to 4 layers/64 experts/top-4, NKI grouped experts, eager",
            inits=("random",),
        ),
    )
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise KeyError(name)
    return RECIPES[name]
