"""The one entry torchrun starts on every rank, on every tier.

    torchrun --nproc_per_node=N -m harness.train --run-dir DIR [torchtitan CLI overrides]

The run's options are the ``RunOptions`` that ``python -m harness run`` resolved,
checked and wrote to ``DIR/run.json`` before starting torchrun (``harness.launch``);
the rank reads them from there. Every other argument (``--training.steps 3``,
``--parallelism.…``) goes to torchtitan's own CLI parser on top of the recipe's
config, exactly as with ``torchtitan.train``.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path

from harness.options import RunOptions

STEPS_FILE = "steps.jsonl"
PROVENANCE_FILE = "provenance.json"
RUN_FILE = "run.json"


def build_config(opts: RunOptions, cli_overrides: list[str] = ()):
    """The recipe's ``Trainer.Config`` for resolved ``opts``, then kernel and CLI overrides."""
    config = recipe_config(opts)
    check_inputs(opts, config)
    return finish_config(config, opts, cli_overrides)


def recipe_config(opts: RunOptions):
    """The recipe's ``Trainer.Config`` with the run's deltas for resolved ``opts``, before kernel and CLI overrides."""
    from harness.options import apply_run_options
    from recipes.registry import get_recipe

    return apply_run_options(get_recipe(opts.recipe).config_fn()(opts.recipe_inputs()), opts)


def check_inputs(opts: RunOptions, config) -> None:
    """Refuse a tokenizer, weights or sizes that disagree with the model the recipe builds."""
    from harness import provenance
    from harness.preflight import check_checkpoint_tensors

    provenance.check(opts, config)
    if not hasattr(config, "hf_model"):  # the HF backend builds what config.json describes
        check_checkpoint_tensors(opts, config.model_spec)


def finish_config(config, opts: RunOptions, cli_overrides: list[str] = ()):
    """Apply ``--override`` specs and torchtitan CLI overrides; refuse shapes a kernel cannot take."""
    if opts.overrides:
        from recipes.overrides import apply_override_specs

        apply_override_specs(config, opts.overrides)
    from harness.titan_cli import apply_cli_overrides
    from recipes.tutorial import check_compile

    config = apply_cli_overrides(config, cli_overrides)
    check_compile(config, opts.tier)
    check_kernel_constraints(config, opts.tier)
    return config


def tier_lnc(tier: str) -> int:
    """The LNC the ranks of ``tier`` run with: ``NEURON_LOGICAL_NC_CONFIG`` if set, else the tier's launch env."""
    from recipes.platform.neuron import logical_neuron_cores
    from recipes.tiers import TIERS

    if "NEURON_LOGICAL_NC_CONFIG" in os.environ or tier not in TIERS:
        return logical_neuron_cores()
    return int(TIERS[tier].extra_env.get("NEURON_LOGICAL_NC_CONFIG", logical_neuron_cores()))


def check_kernel_constraints(config, tier: str = "cpu") -> list[str]:
    """Refuse, before any rank trains, a shape an enabled NKI kernel cannot take; name what was checked.

    A kernel's nodes can only be in the config if its module was imported (its
    override made them), so a config without kernels imports no kernel module.
    rope_hf's seq_len rule is checked on every tier (``enforce_kernel_constraints``);
    the grouped-experts shapes where nkilib runs them (``Tier.runs_nki_kernels``: trn2).

    Sources: rope_hf asserts ``seq_len % (128 * LNC) == 0`` in ``_validate_apply_rope_inputs``
    (aws-neuron/nki-library src/nkilib_src/nkilib/core/embeddings/rope_hf.py); the MoE
    kernels' rules and their sources are ``recipes.kernels.grouped_experts.MOE_CONSTRAINTS``.
    """
    from recipes.tiers import TIERS

    checked = []
    rope = sys.modules.get("recipes.kernels.rope")
    if rope is not None:
        ropes = [cfg for _, cfg, _, _ in config.traverse(rope.NKIRoPE.Config) if cfg.enforce_kernel_constraints]
        if ropes:
            lnc = tier_lnc(tier)
            rope.check_seq_len(config.training.seq_len, lnc)
            checked.append(f"rope_hf: seq_len {config.training.seq_len} % (128 x LNC {lnc}) == 0 ({len(ropes)} nodes)")
    experts = sys.modules.get("recipes.kernels.grouped_experts")
    if experts is not None and TIERS[tier].runs_nki_kernels:
        nodes = [cfg for _, cfg, _, _ in config.traverse(experts.TrnGroupedExperts.Config)]
        lnc = tier_lnc(tier)
        for shape in sorted({(cfg.dim, cfg.hidden_dim) for cfg in nodes}):
            experts.check_moe_shapes(*shape, lnc)
            checked.append(f"grouped_experts: dim {shape[0]}, hidden_dim {shape[1]} at LNC {lnc} ({len(nodes)} nodes)")
    return checked


class StepRecorder:
    """A torchtitan metric logger that appends each step's numbers to ``steps.jsonl``.

    Registered on rank 0 beside torchtitan's own loggers, so the numbers
    are exactly the ones torchtitan prints.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.started = time.perf_counter()

    def log(self, metrics: dict, step: int) -> None:
        record = {
            "step": step,
            "loss": metrics["loss_metrics/global_avg_loss"],
            "grad_norm": metrics["grad_norm"],
            "tokens_per_s": metrics["throughput(tps)"],
            "step_time_s": metrics["time_metrics/end_to_end(s)"],
            "max_reserved_gib": metrics["memory/max_reserved(GiB)"],
            "tflops": metrics["tflops"],
            "mfu_pct": metrics.get("mfu(%)"),
            "wall_s": time.perf_counter() - self.started,
            # wall-clock end of the step: the launcher's time to the first step (harness.speed).
            "unix_s": time.time(),
        }
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        return None


def write_provenance(opts: RunOptions, config, path: Path) -> None:
    """The run's provenance (harness.provenance), and how this rank started (``rank_start``)."""
    from harness import provenance

    allowed = [m for m in provenance.mismatches(opts, config) if m.name in opts.allow_mismatch]
    record = {**provenance.provenance(opts, config, allowed), "rank_start": RANK_START}
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")


#: How this rank's process started, as seen at its entry: "preloaded" when torchtitan's trainer
#: was already imported (forked from harness.elastic's forkserver), else "exec" (a fresh interpreter).
RANK_START = "exec"
PRELOAD_MARKER = "torchtitan.trainer"


def record_steps(trainer, path: Path) -> None:
    """Add a StepRecorder beside whatever loggers torchtitan configured (maybe none), through the declared hook."""
    from recipes import titan

    def beside(logger):
        loggers = titan.LoggerContainer()
        loggers.add_logger(logger)
        loggers.add_logger(StepRecorder(path))
        return loggers

    titan.wrap_hook(trainer.metrics_processor, "MetricsProcessor.logger", beside)


def train(opts: RunOptions, cli_overrides: list[str] = ()) -> None:
    """Build the recipe and train it in this process (one torchrun rank)."""
    import torch

    from harness import faults, reference
    from harness.export import FINAL_STATE_FILE, finish_export, record_final_state

    config = build_config(opts, cli_overrides)
    rank = int(os.environ.get("RANK", "0"))
    run_dir = Path(config.dump_folder)
    trainer = None
    try:
        trainer = config.build()
        if rank == 0:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / STEPS_FILE).unlink(missing_ok=True)
            record_steps(trainer, run_dir / STEPS_FILE)
        if rank == 0:
            write_provenance(opts, config, run_dir / PROVENANCE_FILE)
        faults.install(trainer, rank)
        reference.install(trainer, opts, run_dir, rank)  # --init hf: step 1's batches, for the host's reference loss
        trainer.train()
        if opts.export:
            record_final_state(trainer, run_dir / FINAL_STATE_FILE, rank)
    finally:
        if trainer is not None:
            trainer.close()
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    if rank == 0 and opts.export:
        finish_export(opts, config)


#: ``PR_SET_PDEATHSIG`` from <linux/prctl.h>; see prctl(2).
PR_SET_PDEATHSIG = 1
#: What a rank gets when torchrun vanishes without closing it (torchrun itself
#: SIGTERMs its ranks on an orderly stop): nothing on a rank is worth saving then,
#: and a killed process releases its devices (NeuronCores) at once.
RANK_DEATH_SIGNAL = signal.SIGKILL


def _prctl():
    """libc's ``prctl``, loaded once (before any fork, so a preexec_fn only calls it)."""
    global _PRCTL
    if _PRCTL is None:
        _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
    return _PRCTL


_PRCTL = None


def die_with_parent(sig: int, parent: int | None = None) -> None:
    """Have Linux send ``sig`` to this process the moment its parent exits.

    prctl(2) PR_SET_PDEATHSIG: the kernel, not a poll, ends an orphan; the setting
    survives exec. A parent that died before the call would never trigger it, so
    the parent pid is checked after it (``parent``: the pid it must be, when known).
    No-op off Linux.
    """
    if not sys.platform.startswith("linux"):
        return
    expected = os.getppid() if parent is None else parent
    if _prctl()(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != expected or os.getppid() == 1:
        os.kill(os.getpid(), sig)


def _error_handler():
    """torch elastic's error handler, with this rank's number in what it records.

    torchrun (torch/distributed/elastic/multiprocessing/api.py) gives each rank its
    own ``TORCHELASTIC_ERROR_FILE``; ``@record`` writes the rank's exception there
    and torchrun's own ``@record`` copies the first failure's file to torchrun's
    ``TORCHELASTIC_ERROR_FILE`` (errors/__init__.py ``record``, error_handler.py
    ``dump_error_file``). The file holds no rank number, so this adds it.
    """
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    class RankErrorHandler(ErrorHandler):
        def record_exception(self, e: BaseException) -> None:
            super().record_exception(e)
            path = self._get_error_file_path()
            if not path or not os.path.isfile(path):
                return
            with open(path) as f:
                data = json.load(f)
            data["message"]["extraInfo"]["rank"] = os.environ.get("RANK", "0")
            with open(path, "w") as f:
                json.dump(data, f)

    return RankErrorHandler()


def main(argv: list[str] | None = None) -> int:
    global RANK_START
    RANK_START = "preloaded" if PRELOAD_MARKER in sys.modules else "exec"
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a torchrun rank: end with torchrun, however it ends
        die_with_parent(RANK_DEATH_SIGNAL)
    from torch.distributed.elastic.multiprocessing.errors import record

    handler = _error_handler()
    return record(_main, error_handler=handler)(argv, handler)


def read_run_options(run_dir: Path) -> RunOptions:
    """The resolved options the launcher wrote to ``run_dir/run.json``, with this launch's own world.

    Under torchrun the launch itself says how many processes and nodes there are.
    """
    path = run_dir / RUN_FILE
    if not path.is_file():
        from harness.preflight import PreflightError

        raise PreflightError(
            f"{path} does not exist: harness.train runs the options `python -m harness run` resolved and wrote there; "
            "start runs with `python -m harness run` (or torchtitan's own entry: `-m torchtitan.train --module "
            "recipes.<recipe> --config <recipe>_<tier>`)"
        )
    opts = RunOptions.from_json(path.read_text())
    if "LOCAL_WORLD_SIZE" not in os.environ:
        return opts
    nproc = int(os.environ["LOCAL_WORLD_SIZE"])
    return dataclasses.replace(
        opts,
        nproc=nproc,
        nnodes=int(os.environ["WORLD_SIZE"]) // nproc,
        node_rank=int(os.environ.get("GROUP_RANK", "0")),
        rdzv_endpoint=f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
    )


def _main(argv: list[str] | None, errors) -> int:
    parser = argparse.ArgumentParser(prog="harness.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="the run's directory, holding its run.json")
    args, cli_overrides = parser.parse_known_args(argv)

    from recipes import platform
    from recipes.errors import RecipeError

    try:
        opts = read_run_options(args.run_dir.resolve())
        platform.install(opts.tier)
        train(opts, cli_overrides)
    except RecipeError as e:
        # One line, no traceback; the error file carries it to the launcher's summary.
        print(f"harness.train: error: {e}", file=sys.stderr)
        errors.record_exception(e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
