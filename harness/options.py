"""The options every recipe takes, on every tier, from the CLI or from tests."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from recipes.tiers import TIERS, Tier
from recipes.tutorial import INITS, RecipeInputs, set_rope_theta

__all__ = ["INITS", "RunOptions", "apply_run_options"]


@dataclass
class RunOptions:
    """One training run of one recipe. ``None`` means "the tier's default"."""

    recipe: str = "native_qwen3"
    tier: str = "cpu"
    nproc: int | None = None
    #: Multi-node through torchrun's c10d rendezvous; node 0 hosts the rendezvous store.
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    steps: int | None = None
    seq_len: int | None = None
    local_batch_size: int | None = None
    layers: int | None = None
    init: str = "hf"
    model_dir: Path | None = None
    dataset_dir: Path | None = None
    #: Tokenizer directory; default: --model-dir (the weights' own tokenizer), else the tier's.
    tokenizer_dir: Path | None = None
    #: Replace the recipe's RoPE theta (to measure what a wrong theta costs).
    rope_theta: float | None = None
    #: Mismatch names (see harness.provenance) accepted as warnings instead of refusals.
    allow_mismatch: list[str] = field(default_factory=list)
    export_dir: Path | None = None
    run_dir: Path | None = None
    seed: int = 0
    overrides: list[str] = field(default_factory=list)
    overwrite: bool = False
    #: Save the final HF export (``last_save_in_hf``). Measurement-only runs skip the write.
    export: bool = True

    @property
    def tier_preset(self) -> Tier:
        return TIERS[self.tier]

    def resolved(self) -> "RunOptions":
        """A copy with every tier default filled in and paths made absolute."""
        tier = self.tier_preset
        model_dir = self.model_dir or tier.model_dir

        def absolute(p: Path | None) -> Path | None:
            return Path(p).expanduser().resolve() if p is not None else None

        return RunOptions(
            recipe=self.recipe,
            tier=self.tier,
            nproc=self.nproc or tier.nproc,
            nnodes=self.nnodes,
            node_rank=self.node_rank,
            rdzv_endpoint=self.rdzv_endpoint,
            steps=self.steps or tier.steps,
            seq_len=self.seq_len or tier.seq_len,
            local_batch_size=self.local_batch_size or tier.local_batch_size,
            layers=self.layers,
            init=self.init,
            model_dir=absolute(model_dir),
            dataset_dir=absolute(self.dataset_dir or tier.dataset_path),
            tokenizer_dir=absolute(self.tokenizer_dir or model_dir or tier.tokenizer_dir),
            rope_theta=self.rope_theta,
            allow_mismatch=list(self.allow_mismatch),
            export_dir=absolute(self.export_dir),
            run_dir=absolute(self.run_dir),
            seed=self.seed,
            overrides=list(self.overrides),
            overwrite=self.overwrite,
            export=self.export,
        )

    def recipe_inputs(self) -> RecipeInputs:
        """What the recipe builds its config from (``self`` resolved): tier, init, weights, tokenizer, data, layers."""
        return RecipeInputs(self.tier, self.init, self.model_dir, self.tokenizer_dir, self.dataset_dir, self.layers)

    def to_json(self) -> str:
        data = asdict(self)
        return json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in data.items()})

    @classmethod
    def from_json(cls, text: str) -> "RunOptions":
        data = json.loads(text)
        paths = {f.name for f in fields(cls) if "Path" in str(f.type)}
        return cls(**{k: Path(v) if k in paths and v is not None else v for k, v in data.items()})


def apply_run_options(config, opts: RunOptions):
    """A run's own deltas on top of a recipe's config: steps, seq_len, batch, seed, RoPE theta, paths, export.

    ``opts`` must be ``RunOptions.resolved()``; the recipe built ``config`` from
    ``opts.recipe_inputs()``. Returns ``config`` for chaining.
    """
    config.training.steps = opts.steps
    config.training.seq_len = opts.seq_len
    config.training.local_batch_size = opts.local_batch_size
    config.debug.seed = opts.seed
    if opts.rope_theta is not None:
        set_rope_theta(config, opts.rope_theta)
    if opts.run_dir:
        config.dump_folder = str(opts.run_dir)
    # Measurement-only runs (``export=False``) load weights if any and save nothing.
    config.checkpoint.enable = opts.init == "hf" or opts.export
    config.checkpoint.interval = opts.steps
    config.checkpoint.load_only = not opts.export
    return config
