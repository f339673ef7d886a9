"""``python -m harness run RECIPE|all --tier trn2 --dry-run``: everything a launch checks, on any machine.

For each planned run (recipe × init) this builds the recipe's full-size
``Trainer.Config`` exactly as the launcher does, applies the overrides, checks
every kernel constraint at the tier's shapes, builds the model on the meta device
as torchtitan's trainer does (no memory, no device, no Neuron package; the trn2
platform is never installed), compares it with upstream's own
``model_registry`` flavor shrunk as the tutorial shrinks it, and writes the exact
torchrun command, its environment and the resolved config to
``<report-dir>/dry-run/<recipe>-<tier>-<init>.json``.

Inputs a trn2 run needs but this machine lacks are placeholders, said so in the
output: without ``QWEN3_4B_DIR`` the real sizes come from
``fixtures/qwen3-4b-instruct-2507/config.json`` (no weights, no tokenizer: the
tokenizer and weight checks are skipped, the size checks against config.json are
not), and without ``QWEN3_DATASET_DIR`` the command reads ``"$QWEN3_DATASET_DIR"``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.checks import preflight
from harness.checks.built_config import check_built, check_inputs
from harness.checks.mismatch import refuse, size_mismatches
from harness.checks.preflight import OPTION_CHECKS
from harness.config.build import build_config as build
from harness.config.tree import config_tree
from harness.declare.catalogue import Upstream, entry
from harness.launch.lifecycle import torchrun_command
from harness.night import plan as nightly
from harness.options.run_options import RunOptions, command_line
from recipes.errors import RecipeError
from recipes.hf_config import read_hf_config
from recipes.platform import OFFLINE_ENV, offline_env
from recipes.platform.torchtitan_checkout import checkout_info, describe
from recipes.specs import QWEN3_4B_INSTRUCT_2507 as QWEN3_4B_SIZES
from recipes.specs import read_hf_dims
from recipes.tiers import REPO_ROOT, TIERS
from recipes.tutorial import RecipeInputs

DRY_RUN_DIR = "dry-run"

#: The dataset path the config is built with when there is none; nothing reads it in a dry run.
DATASET_STAND_IN = Path("/QWEN3_DATASET_DIR-is-not-set")

#: Environment variables the launch passes through that decide a trn2 run (never secrets).
PASSED_ENV_PREFIXES = ("NEURON_", "QWEN3_", "FI_", "TORCH_NEURONX_", "OMP_")


#: Hyper-parameters compared, named as in config.json.
DIM_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "moe_intermediate_size",
    "num_experts",
    "num_experts_per_tok",
    "tie_word_embeddings",
    "rope_theta",
)


class DryRunError(RecipeError):
    """The built model differs from what the recipe claims to reproduce."""


@dataclass(frozen=True)
class Placeholder:
    """An input this machine does not have, shown in the command as ``"$<env>"``."""

    option: str
    env: str
    note: str

    @property
    def shown(self) -> str:
        return f"${self.env}"


@dataclass
class Plan:
    """One planned run: the options the config is built from and the ones the command shows."""

    build: RunOptions
    shown: RunOptions
    placeholders: list[Placeholder] = field(default_factory=list)

    @property
    def has_weights(self) -> bool:
        return not any(p.option == "--model-dir" for p in self.placeholders)


# --- Planning: placeholders for what this machine lacks -------------------------------------------


def plan_run(opts: RunOptions) -> Plan:
    """Resolve ``opts`` without a device; put placeholders where trn2 inputs are missing.

    Runs the device-free preflight checks (names, sizes, nodes, mismatch names); the
    device, weights, tokenizer and dataset checks need the instance and its files.
    """

    for check in OPTION_CHECKS:
        check(opts)
    placeholders = []
    model_dir = opts.model_dir or opts.tier_preset.model_dir
    if model_dir is None and opts.tier == "trn2":
        placeholders.append(
            Placeholder(
                "--model-dir",
                "QWEN3_4B_DIR",
                f"QWEN3_4B_DIR is not set: sizes from {QWEN3_4B_SIZES / 'config.json'} (no weights, no "
                "tokenizer: tokenizer and weight checks skipped)",
            )
        )
        opts = dataclasses.replace(
            opts, model_dir=QWEN3_4B_SIZES, tokenizer_dir=opts.tokenizer_dir or QWEN3_4B_SIZES
        )
    dataset = opts.dataset_dir or opts.tier_preset.dataset_path
    if dataset is None:
        placeholders.append(
            Placeholder(
                "--dataset-dir",
                "QWEN3_DATASET_DIR",
                "QWEN3_DATASET_DIR is not set: a real run needs it",
            )
        )
        opts = dataclasses.replace(opts, dataset_dir=DATASET_STAND_IN)
    build = opts.resolved()
    shown = build
    for p in placeholders:
        if p.option == "--model-dir":
            shown = dataclasses.replace(shown, model_dir=Path(p.shown), tokenizer_dir=Path(p.shown))
        else:
            shown = dataclasses.replace(shown, dataset_dir=Path(p.shown))
    plan = Plan(build=build, shown=shown, placeholders=placeholders)
    check_files(plan)
    return plan


def check_files(plan: Plan) -> None:
    """The preflight checks of the files this machine has (never the device: that needs the instance)."""

    checks = [preflight.check_hf_model, preflight.check_export_dir]
    if plan.has_weights:
        checks += [preflight.check_model_dir, preflight.check_tokenizer]
    if not any(p.option == "--dataset-dir" for p in plan.placeholders):
        checks.append(preflight.check_dataset_dir)
    for check in checks:
        check(plan.build)


# --- Checks ---------------------------------------------------------------------------------------


def check_sizes(opts: RunOptions, config) -> list[str]:
    """Without weights: the built sizes against config.json, refused as a real run refuses them."""

    if opts.init != "hf":
        return []
    allowed = refuse(size_mismatches(opts, config, read_hf_dims(opts.model_dir)), opts)
    return [f"sizes vs {opts.model_dir / 'config.json'}"] + [
        f"allowed mismatch {m.message}" for m in allowed
    ]


def build_config(plan: Plan, cli_overrides: list[str]) -> tuple[object, list[str]]:
    """The config the launcher would hand every rank, and what was checked on the way."""

    opts = plan.build
    config = build(opts, cli_overrides)
    if plan.has_weights:
        check_inputs(opts, config)
        checked = ["tokenizer, weights and sizes (provenance, checkpoint tensors)"]
    else:
        checked = check_sizes(opts, config)
    return config, checked + check_built(opts, config)


# --- The model on the meta device, and upstream's -------------------------------------------------


def dims_of(hf_config: dict) -> dict:
    """:data:`DIM_KEYS` of a config.json-style dict (theta lifted out of ``rope_parameters``)."""
    rope = hf_config.get("rope_parameters") or {}
    values = {**hf_config, "rope_theta": hf_config.get("rope_theta", rope.get("rope_theta"))}
    return {k: values[k] for k in DIM_KEYS if values.get(k) is not None}


def spec_dims(spec) -> dict:
    """The hyper-parameters a torchtitan Qwen3 spec builds."""
    from harness.rank.export import hf_config  # noqa: PLC0415 -- heavy: harness.rank.export imports torch.distributed.tensor (1.2 s)

    return dims_of(hf_config(spec, "bfloat16"))


def config_dims(config) -> dict:
    """The hyper-parameters the recipe's model has: its spec's, or the HF backend's config.json."""
    if hasattr(config, "hf_model"):
        return dims_of(read_hf_config(config.hf_model))
    return spec_dims(config.model_spec)


def build_on_meta(model_config, dtype: str = "float32"):
    """``model_config.build()`` on the meta device in ``dtype``, as torchtitan's trainer builds it."""

    from recipes.titan import TORCH_DTYPE_MAP, set_default_dtype  # noqa: PLC0415 -- heavy: these names import torchtitan (2.5 s); a dry run that refuses stays fast

    with torch.device("meta"), set_default_dtype(TORCH_DTYPE_MAP[dtype]):
        return model_config.build()


def hf_parameter_shapes(spec, model, hf_assets_path: Path) -> dict[str, list[int]]:
    """Parameter names and shapes as a Hugging Face checkpoint stores them (the spec's own adapter)."""
    adapter = spec.state_dict_adapter(spec.model, str(hf_assets_path))
    return {k: list(v.shape) for k, v in adapter.to_hf(model.state_dict()).items()}


def _set_fields(obj, name: str, value) -> None:
    """Set every dataclass field called ``name`` anywhere under ``obj`` (lists included)."""
    if isinstance(obj, (list, tuple)):
        for item in obj:
            _set_fields(item, name, value)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            if f.name == name:
                setattr(obj, name, value)
            else:
                _set_fields(getattr(obj, f.name, None), name, value)


def upstream_spec(upstream: Upstream, layers: int | None = None):
    """``model_registry(flavor)`` shrunk as the tutorial shrinks it: first N layers, E experts, top-k."""
    from recipes.titan import model_registry  # noqa: PLC0415 -- heavy: these names import torchtitan (2.5 s); a dry run that refuses stays fast

    spec = model_registry(upstream.flavor)
    n_layers = layers or upstream.n_layers
    if n_layers is not None:
        spec.model.layers = spec.model.layers[:n_layers]
    if upstream.num_experts is not None:
        _set_fields(spec.model.layers, "num_experts", upstream.num_experts)
        for layer in spec.model.layers:  # the router's gate is a Linear with one output per expert
            layer.moe.router.gate.out_features = upstream.num_experts
    if upstream.top_k is not None:
        _set_fields(spec.model.layers, "top_k", upstream.top_k)
    return spec


def compare_with_upstream(config, model, opts: RunOptions) -> dict:
    """The built model against upstream's spec: hyper-parameters and every parameter's HF name and shape.

    Parameters must match exactly (else :class:`DryRunError`); hyper-parameters that
    change no shape (RoPE theta) are reported as differences.
    """
    upstream = entry(opts.recipe).upstream
    spec = upstream_spec(upstream, opts.layers)
    ours = hf_parameter_shapes(config.model_spec, model, opts.model_dir)
    theirs = hf_parameter_shapes(spec, build_on_meta(spec.model), opts.model_dir)
    ours_dims, their_dims = config_dims(config), spec_dims(spec)
    differences = {
        k: {"built": ours_dims.get(k), "upstream": their_dims.get(k)}
        for k in sorted(set(ours_dims) | set(their_dims))
        if ours_dims.get(k) != their_dims.get(k)
    }
    shape_diffs = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
    shrink = {
        k: v for k, v in dataclasses.asdict(upstream).items() if v is not None and k != "flavor"
    }
    name = f'model_registry("{upstream.flavor}")' + (f" shrunk {shrink}" if shrink else "")
    if shape_diffs:
        key = shape_diffs[0]
        raise DryRunError(
            f"recipe {opts.recipe!r} builds a model that differs from upstream's {name}: parameter {key!r} "
            f"is {ours.get(key)} here, {theirs.get(key)} upstream ({len(shape_diffs)} parameters differ)"
        )
    return {
        "spec": name,
        "dims": their_dims,
        "same_parameters": True,
        "parameters_compared": len(ours),
        "differences": differences,
    }


def model_report(config, opts: RunOptions) -> dict:
    """Build the model on meta as the trainer does; its sizes, and how it compares with upstream."""
    started = time.perf_counter()
    dims = config_dims(config)  # before update_from_config resizes RoPE to seq_len
    config.model_spec.model.update_from_config(config=config)
    model = build_on_meta(config.model_spec.model, config.training.dtype)
    parameters = sum(p.numel() for p in model.parameters())
    report = {
        "class": type(model).__qualname__,
        "device": str(next(model.parameters()).device),
        "dims": dims,
        "parameters": parameters,
        "build_s": round(time.perf_counter() - started, 3),
    }
    if (
        opts.tier == "trn2"
    ):  # every recipe has an upstream (harness.declare.catalogue: a missing one fails its test)
        report["upstream"] = compare_with_upstream(config, model, opts)
    return report


# --- Command, environment, report -----------------------------------------------------------------


def shell_command(argv: list[str], placeholders: list[Placeholder]) -> str:
    """``torchrun ...`` as a shell line: ``python -m torch.distributed.run`` is torchrun; placeholders expand."""

    if argv[:3] == [sys.executable, "-m", "torch.distributed.run"]:
        argv = ["torchrun", *argv[3:]]
    shown = {p.shown for p in placeholders}
    return " ".join(f'"{a}"' if a in shown else shlex.quote(a) for a in argv)


def launch_env(opts: RunOptions) -> dict:
    """What the launch sets for every rank, and the decisive variables it passes through."""

    return {
        "set": {
            **offline_env(),
            **opts.tier_preset.extra_env,
            "PYTHONPATH": f"{REPO_ROOT}:$PYTHONPATH",
        },
        "passed_through": {
            k: v for k, v in sorted(os.environ.items()) if k.startswith(PASSED_ENV_PREFIXES)
        },
    }


def _substitute(value, old: str, new: str):
    """``value`` (a JSON-able tree) with every string equal to ``old`` replaced by ``new``."""
    if isinstance(value, dict):
        return {k: _substitute(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, old, new) for v in value]
    return new if value == old else value


def resolved_config(config, plan: Plan) -> dict:
    """The resolved config as JSON, every node with its class (``_class``: SDPA, the gather-free RoPE,
    NKI's grouped experts, the loss and tokenizer are visible), placeholders' stand-ins shown as placeholders."""

    tree = json.loads(json.dumps(config_tree(config), default=str))
    for p in plan.placeholders:
        stand_in = plan.build.model_dir if p.option == "--model-dir" else plan.build.dataset_dir
        tree = _substitute(tree, str(stand_in), p.shown)
    return tree


def torchtitan_neuron() -> dict:
    """Which TorchTitan Neuron ref and commit this machine's trn2 run would import (none on a laptop)."""

    return checkout_info()


def dry_run(plan: Plan, cli_overrides: list[str]) -> dict:
    """One planned run, checked and described; ``ok`` False with the refusal when it would not start.

    ``command`` is what a user types for this one run; ``torchrun`` what the launcher then
    starts, whose ranks read ``run_json`` from the run directory (``harness.rank.train``).
    """

    opts = plan.shown
    argv = torchrun_command(opts, cli_overrides)
    result = {
        "recipe": opts.recipe,
        "tier": opts.tier,
        "init": opts.init,
        "ok": False,
        "error": None,
        "command": shell_command(
            ["python", "-m", "harness", "run", *command_line(opts), *cli_overrides],
            plan.placeholders,
        ),
        "torchrun": shell_command(argv, plan.placeholders),
        "rank_start": opts.tier_preset.rank_start,
        "argv": argv,
        "run_json": json.loads(opts.to_json()),
        "env": launch_env(opts),
        "placeholders": [dataclasses.asdict(p) | {"shown": p.shown} for p in plan.placeholders],
        "checked": [],
        **({"torchtitan_neuron": torchtitan_neuron()} if opts.tier == "trn2" else {}),
    }
    try:
        config, result["checked"] = build_config(plan, cli_overrides)
        result["config"] = resolved_config(config, plan)
        result["model"] = model_report(config, plan.build)
        result["ok"] = True
    except RecipeError as e:
        result["error"] = str(e)
    return result


def write(result: dict, report_dir: Path) -> Path:
    out = report_dir / DRY_RUN_DIR / f"{result['recipe']}-{result['tier']}-{result['init']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return out


def summary(result: dict, path: Path) -> str:
    head = f"[{result['recipe']}/{result['tier']}/init={result['init']}]"
    if not result["ok"]:
        return f"{head} would be refused: {result['error']}\n  report: {path}"
    model = result["model"]
    dims = model["dims"]
    lines = [
        f"{head} ok: {model['class']} on {model['device']}, {model['parameters']:,} parameters, "
        + ", ".join(
            f"{k} {dims[k]}"
            for k in ("hidden_size", "num_hidden_layers", "vocab_size")
            if k in dims
        ),
        f"  command: {result['command']}",
        f"  starts:  {result['torchrun']}"
        + (
            " (as harness.launch.elastic: ranks forked preloaded)"
            if result["rank_start"] == "preloaded"
            else ""
        ),
    ]
    upstream = model.get("upstream")
    if upstream:
        diffs = ", ".join(
            f"{k} {v['built']} vs {v['upstream']}" for k, v in upstream["differences"].items()
        )
        lines.append(
            f"  same parameters as upstream {upstream['spec']}"
            + (f"; differs in {diffs}" if diffs else "")
        )
    if "torchtitan_neuron" in result:
        lines.append(f"  TorchTitan Neuron: {describe(result['torchtitan_neuron'])}")
    lines += [f"  placeholder {p['shown']}: {p['note']}" for p in result["placeholders"]]
    lines.append(f"  report: {path}")
    return "\n".join(lines)


def cmd_dry_run(
    runs: list[RunOptions], cli_overrides: list[str], report_dir: Path, echo=print
) -> int:
    """Dry-run every planned run; 0 when all would start, 2 when any would be refused.

    On trn2 the nightly's own plan comes first (``harness.night.plan.dry_run_report``): a missing torchtitan
    name refuses the dry run as it would refuse every launch.
    """

    for (
        key,
        value,
    ) in (
        OFFLINE_ENV.items()
    ):  # what platform.install sets; the trn2 platform itself is not installed
        os.environ.setdefault(key, value)
    refused = 0
    if any(opts.tier == "trn2" for opts in runs):
        stand_in = RecipeInputs("trn2", "random", QWEN3_4B_SIZES, QWEN3_4B_SIZES, DATASET_STAND_IN)
        refused += not nightly.dry_run_report(report_dir / DRY_RUN_DIR, stand_in, echo)
        echo("")
    for opts in runs:
        if opts.tier not in TIERS:
            echo(
                f"python -m harness run: error: unknown tier {opts.tier!r}; choose one of: {', '.join(TIERS)}"
            )
            return 2
        try:
            plan = plan_run(opts)
        except RecipeError as e:
            echo(f"python -m harness run: error: {e}")
            return 2
        result = dry_run(plan, cli_overrides)
        refused += not result["ok"]
        echo(summary(result, write(result, report_dir)))
    return 2 if refused else 0
