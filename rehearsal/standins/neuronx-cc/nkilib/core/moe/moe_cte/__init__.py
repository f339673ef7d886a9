"""Stand-in of aws-neuron/nki-library src/nkilib_src/nkilib/core/moe/moe_cte/__init__.py (same exports)."""

from .moe_cte import (  # noqa: F401 -- the package's exports, as the real __init__.py
    BlockShardStrategy,
    MoECTEImplementation,
    MoECTESpec,
    QuantizationConfig,
    ShardOnBlockConfig,
    ShardOnIConfig,
    SkipMode,
    moe_cte,
)

__all__ = [
    "moe_cte",
    "MoECTESpec",
    "MoECTEImplementation",
    "ShardOnBlockConfig",
    "ShardOnIConfig",
    "BlockShardStrategy",
    "SkipMode",
]
