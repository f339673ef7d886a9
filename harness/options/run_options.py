"""The options of one run, declared once: the CLI (tyro), ``run.json`` and the ranks all read this dataclass.

``python -m harness run`` derives its flags from ``RunOptions`` with tyro (the CLI
library torchtitan itself uses): each field is one ``--kebab-case`` flag, its
comment the help. The launcher writes the resolved options to the run's
``run.json``; every rank reads them from there (``harness.rank.train --run-dir DIR``),
so no option is turned back into flags and parsed again.
"""

from __future__ import annotations

import functools
import json
import os
import typing
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Annotated

import tyro

from harness.base.run_dir import RUN_FILE
from harness.base.tyro_events import ParseRefused, _spelling, describe, refuse
from harness.options.mapped import check_one_value
from harness.options.paths import HARNESS_PATH_OPTIONS, check_given_paths
from recipes.errors import RecipeError
from recipes.registry import DEFAULT_RECIPE
from recipes.tiers import REPO_ROOT, TIERS, Tier
from recipes.tutorial import INITS, RecipeInputs, set_rope_theta

__all__ = [
    "INITS",
    "RunCommand",
    "RunOptions",
    "apply_run_options",
    "command_line",
    "parse_run_command",
]

DEFAULT_REPORT_DIR = REPO_ROOT / "report"

#: A list flag given once per value (``--override a --override b``), as before tyro.
Repeated = tyro.conf.UseAppendAction


@dataclass
class RunOptions:
    """One training run of one recipe. ``None`` means "the tier's default"."""

    #: A recipe name (see ``python -m harness list``).
    recipe: str = DEFAULT_RECIPE
    #: cpu or trn2.
    tier: str = "cpu"
    #: Processes per node (default: the tier's: cpu 2, trn2 64).
    nproc: int | None = None
    #: Nodes in a multi-node run (torchrun's c10d rendezvous; node 0 hosts its store).
    nnodes: int = 1
    #: This node's index; node 0 hosts the rendezvous.
    node_rank: int = 0
    #: HOST:PORT of the rendezvous store on node 0 (multi-node).
    rdzv_endpoint: str | None = None
    #: Seconds every node has to join the rendezvous before the run ends (multi-node; torch's join_timeout).
    rdzv_timeout: int = 600
    #: Training steps (default: the tier's).
    steps: int | None = None
    #: Tokens per sequence (default: the tier's).
    seq_len: int | None = None
    #: Sequences per rank per step (default: the tier's).
    local_batch_size: int | None = None
    #: Keep the first N layers of the real model (cpu: the real 4B width, not tiny dims).
    layers: int | None = None
    #: hf (load --model-dir's weights) or random.
    init: str = "hf"
    #: Local Hugging Face model dir (weights, config.json, tokenizer; default: the tier's).
    model_dir: Path | None = None
    #: Local dir of *.jsonl {"text": ...} files (default: the tier's).
    dataset_dir: Path | None = None
    #: Tokenizer dir (default: --model-dir's own, else the tier's).
    tokenizer_dir: Path | None = None
    #: Replace the recipe's RoPE theta (to measure what a wrong theta costs).
    rope_theta: float | None = None
    #: Accept one tokenizer/weights/model mismatch as a warning (tokenizer, vocab, rope_theta, seq_len, ...).
    allow_mismatch: Annotated[list[str], Repeated, tyro.conf.arg(metavar="NAME")] = field(
        default_factory=list
    )
    #: Where the final HF export is published.
    export_dir: Path | None = None
    #: This run's dump folder (checkpoints, steps.jsonl, run.json); the harness names it.
    run_dir: tyro.conf.Suppress[Path | None] = None
    #: Seed of the model init and the data order.
    seed: int = 0
    #: A kernel override, on every matching module or scoped by model-relative fqn globs.
    overrides: Annotated[
        list[str], Repeated, tyro.conf.arg(name="override", metavar="NAME[=GLOB,...]")
    ] = field(default_factory=list)
    #: Replace a non-empty --export-dir.
    overwrite: bool = False
    #: Save the final HF export (``last_save_in_hf``); measurement-only runs skip the write.
    export: bool = True
    #: Compare torchtitan's and transformers' modules on step 1's batch even when the host reference
    #: agrees (it runs by itself when they disagree): the report's "first divergence" section.
    localize: bool = False
    #: Score step 1 forward-only (``harness.rank.step1_forward``) instead of training: a step-1 loss is a
    #: forward pass before any update. The main job's full-width random-init runs; one step, no export.
    forward_only: tyro.conf.Suppress[bool] = False
    #: Threads per rank (OMP_NUM_THREADS); None: the tier's (cpu: 1, so that ranks and xdist workers share the cores).
    threads: tyro.conf.Suppress[int | None] = None

    @property
    def tier_preset(self) -> Tier:
        return TIERS[self.tier]

    def resolved(self) -> "RunOptions":
        """A copy with every tier default filled in and paths made absolute."""
        tier = self.tier_preset
        model_dir = self.model_dir or tier.model_dir

        def absolute(p: Path | None) -> Path | None:
            return Path(p).expanduser().resolve() if p is not None else None

        return replace(
            self,
            nproc=self.nproc or tier.nproc,
            steps=self.steps or tier.steps,
            seq_len=self.seq_len or tier.seq_len,
            local_batch_size=self.local_batch_size or tier.local_batch_size,
            model_dir=absolute(model_dir),
            dataset_dir=absolute(self.dataset_dir or tier.dataset_path),
            tokenizer_dir=absolute(self.tokenizer_dir or tier.tokenizer_for(model_dir)),
            export_dir=absolute(self.export_dir),
            run_dir=absolute(self.run_dir),
            allow_mismatch=list(self.allow_mismatch),
            overrides=list(self.overrides),
        )

    def recipe_inputs(self) -> RecipeInputs:
        """What the recipe builds its config from (``self`` resolved): tier, init, weights, tokenizer, data, layers."""
        return RecipeInputs(
            self.tier, self.init, self.model_dir, self.tokenizer_dir, self.dataset_dir, self.layers
        )

    def to_json(self) -> str:
        data = asdict(self)
        return json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in data.items()})

    @classmethod
    def from_json(cls, text: str) -> "RunOptions":
        data = json.loads(text)
        paths = {f.name for f in fields(cls) if "Path" in str(f.type)}
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(
                f"run options {unknown} are not fields of RunOptions (a run.json from another version?)"
            )
        return cls(**{k: Path(v) if k in paths and v is not None else v for k, v in data.items()})


@dataclass
class RunCommand(RunOptions):
    """Run recipes under torchrun and write the report; options tyro does not know go to torchtitan's parser."""

    #: A recipe name (see `python -m harness list`) or 'all'.
    recipe: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RECIPE")] = tyro.MISSING
    #: hf (load --model-dir's weights) or random; default: every init the recipe supports.
    init: str | None = None
    #: Where results.json, results.md and the run directories go.
    report_dir: Path = DEFAULT_REPORT_DIR
    #: Build and check every run's full-size config and model on the meta device, write the launch
    #: command, environment and resolved config to REPORT_DIR/dry-run/; start nothing (no device needed).
    dry_run: bool = False

    def options(self, **changes) -> RunOptions:
        """The ``RunOptions`` part of this command, with ``changes``."""
        return replace(
            RunOptions(**{f.name: getattr(self, f.name) for f in fields(RunOptions)}), **changes
        )


def parse_run_command(argv: list[str]) -> tuple[RunCommand, list[str]]:
    """``run``'s arguments: the command (from ``RunCommand``'s fields, via tyro) and the torchtitan overrides left over.

    A refused flag (``--steps abc``) is one ``RecipeError`` line from tyro's parse-error event
    (``harness.base.tyro_events``), not tyro's box; ``--help`` still prints tyro's help.
    """
    from recipes import titan  # noqa: PLC0415 -- --help stays fast: recipes.titan (on python -m harness's import path)

    on_parse_error, _ = titan.optional("on_parse_error")
    parse = functools.partial(
        tyro.cli, RunCommand, args=argv, prog="python -m harness run", return_unknown_args=True
    )
    if on_parse_error is None:  # an older tyro: its own box
        return checked_paths(argv, parse())
    try:
        with on_parse_error(refuse):
            return checked_paths(argv, parse())
    except ParseRefused as refused:
        try:
            what = describe(refused.event, argv, lambda flag: None)
        except (
            AttributeError,
            TypeError,
        ) as e:  # the event is tyro's private API: a new tyro may reshape it
            what = f"{type(refused.event).__name__} (tyro's event could not be read: {e})"
        raise RecipeError(f"{what}; see python -m harness run --help") from None


def checked_paths(argv: list[str], parsed: tuple) -> tuple:
    """``parsed``, once every path ``argv`` names (the harness's and torchtitan's) is one a run can take
    and no harness option differs from the torchtitan option it sets (``harness.options.mapped``)."""
    check_given_paths(argv, HARNESS_PATH_OPTIONS + TITAN_PATH_OPTIONS)
    check_one_value(argv, parsed[1])
    return parsed


#: torchtitan options that name a file or directory (``checkpoint.folder`` is inside the dump folder by design).
TITAN_PATH_OPTIONS = (
    "--hf_assets_path",
    "--dataloader.dataset_path",
    "--dump_folder",
    "--checkpoint.initial_load_path",
)


def absolute_titan_paths(cli_overrides: list[str], cwd: Path | None = None) -> list[str]:
    """``cli_overrides`` with each relative path of a :data:`TITAN_PATH_OPTIONS` option made absolute from ``cwd``.

    The user typed it from the current directory; the ranks run in the repository root, where
    torchtitan would otherwise read it, as the harness's own ``--model-dir`` is read from the current directory.
    """

    cwd = Path.cwd() if cwd is None else cwd
    wanted = {_spelling(o) for o in TITAN_PATH_OPTIONS}
    out = list(cli_overrides)
    for i, token in enumerate(out):
        name, eq, value = token.partition("=")
        if _spelling(name) not in wanted:
            continue
        if eq:
            out[i] = f"{name}={_absolute(value, cwd)}"
        elif i + 1 < len(out) and not out[i + 1].startswith("--"):
            out[i + 1] = _absolute(out[i + 1], cwd)
    return out


def _absolute(value: str, cwd: Path) -> str:
    return str((cwd / Path(value).expanduser()).resolve()) if value else value


@functools.cache
def _field_markers() -> dict[str, tuple]:
    """Each ``RunOptions`` field's ``Annotated`` metadata (tyro's markers), resolved once."""
    hints = typing.get_type_hints(RunOptions, include_extras=True)
    return {name: getattr(hint, "__metadata__", ()) for name, hint in hints.items()}


def flag(name: str) -> str:
    """The CLI flag tyro derives for the ``RunOptions`` field ``name`` (its ``tyro.conf.arg(name=...)`` if any)."""
    renamed = [m.name for m in _field_markers()[name] if getattr(m, "name", None)]
    return "--" + (renamed[0] if renamed else name).replace("_", "-")


def command_line(opts: RunOptions) -> list[str]:
    """``python -m harness run`` arguments that give ``opts`` back: the recipe, then every field not at its default.

    For showing a run as a command (the dry run); the ranks never parse it. Fields tyro
    does not expose (``run_dir``) are left out.
    """
    default = RunOptions()
    args = [opts.recipe]
    for f in fields(RunOptions):
        value = getattr(opts, f.name)
        suppressed = any(m is tyro.conf.Suppress for m in _field_markers()[f.name])
        if f.name == "recipe" or suppressed or value == getattr(default, f.name):
            continue
        if isinstance(value, bool):
            args.append(flag(f.name) if value else "--no-" + flag(f.name)[2:])
            continue
        for item in value if isinstance(value, list) else [value]:
            args += [flag(f.name), str(item)]
    return args


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


def read_run_options(run_dir: Path) -> RunOptions:
    """The resolved options the launcher wrote to ``run_dir/run.json``, with this launch's own world.

    Under torchrun the launch itself says how many processes and nodes there are.
    """
    path = run_dir / RUN_FILE
    if not path.is_file():
        raise RecipeError(
            f"{path} does not exist: harness.rank.train runs the options `python -m harness run` resolved and wrote there; "
            "start runs with `python -m harness run` (or torchtitan's own entry: `-m torchtitan.train --module "
            "recipes.<recipe> --config <recipe>_<tier>`)"
        )
    opts = RunOptions.from_json(path.read_text())
    if "LOCAL_WORLD_SIZE" not in os.environ:
        return opts
    nproc = int(os.environ["LOCAL_WORLD_SIZE"])
    return replace(
        opts,
        nproc=nproc,
        nnodes=int(os.environ["WORLD_SIZE"]) // nproc,
        node_rank=int(os.environ.get("GROUP_RANK", "0")),
        rdzv_endpoint=f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
    )
