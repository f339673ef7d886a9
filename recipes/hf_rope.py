"""transformers' RoPE init, called in the one way every transformers seen so far accepts.

Two places recompute a rotary embedding's ``inv_freq`` from its config: the backend
workaround (``recipes.hf_compat.init_rotary_embeddings``) and any scorer that loads
transformers' own model (the harness's host reference). transformers changed the function's
signature between releases (5.16: ``compute_default_rope_parameters(config, device=None)``;
5.23: ``(config, **kwargs)``), so passing ``device`` broke on 5.23 with ``TypeError: ...
takes 1 positional argument but 2 were given``. Here it is called with the config alone,
after checking it binds; a shape that does not fit is one ``UpstreamShapeError`` line.
This module imports neither torchtitan nor the backend, so a scorer can use it anywhere.
"""

from __future__ import annotations

from recipes.upstream_shape import accepts, describe, require, require_attributes

#: The workaround a shape message names by default.
ROPE_WORKAROUND = "recipes.hf_compat.init_rotary_embeddings"


def rope_init_function(module, config=None, workaround: str = ROPE_WORKAROUND):
    """The function ``module.__init__`` computes ``inv_freq`` with, checked to take ``(config)``."""
    owner = type(module).__name__
    require_attributes(
        module, ("config", "rope_type", "inv_freq"), "transformers", workaround, owner
    )
    config = module.config if config is None else config
    if module.rope_type == "default":
        where = f"{owner}.compute_default_rope_parameters"
        require(
            hasattr(module, "compute_default_rope_parameters"), "transformers", workaround, where
        )
        fn = module.compute_default_rope_parameters
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: PLC0415 -- heavy: transformers 1.8 s; this module stays light

        where = f"modeling_rope_utils.ROPE_INIT_FUNCTIONS[{module.rope_type!r}]"
        require(module.rope_type in ROPE_INIT_FUNCTIONS, "transformers", workaround, where)
        fn = ROPE_INIT_FUNCTIONS[module.rope_type]
    require(
        accepts(fn, config), "transformers", workaround, f"{where}(config), found {describe(fn)}"
    )
    return fn


def rope_parameters(module, config=None, workaround: str = ROPE_WORKAROUND):
    """``(inv_freq, attention_scaling)`` as ``module``'s own ``__init__`` computes them (from ``config`` if given)."""
    import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light

    config = module.config if config is None else config
    result = rope_init_function(module, config, workaround)(config)
    require(
        isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.Tensor),
        "transformers",
        workaround,
        "(inv_freq tensor, attention_scaling) from the rope init function",
    )
    return result
