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
    )
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise KeyError(name)
    return RECIPES[name]
