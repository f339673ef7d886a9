"""The one entry torchrun starts on every rank, on every tier.

    torchrun --nproc_per_node=N -m harness.rank.train --run-dir DIR [torchtitan CLI overrides]

The run's options are the ``RunOptions`` that ``python -m harness run`` resolved,
checked and wrote to ``DIR/run.json`` before starting torchrun (``harness.launch.lifecycle``);
the rank reads them from there. Every other argument (``--training.steps 3``,
``--parallelism.…``) goes to torchtitan's own CLI parser on top of the recipe's
config, exactly as with ``torchtitan.train``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record

from harness.base.run_dir import PROVENANCE_FILE, STEPS_FILE
from harness.checks.mismatch import mismatches
from harness.config import provenance
from harness.config.build import build_config
from harness.launch import watchdog
from harness.launch.child import RANK_DEATH_SIGNAL, die_with_parent
from harness.options.run_options import RunOptions, read_run_options
from harness.rank import faults, first_batch, step1_forward
from harness.rank.export import FINAL_STATE_FILE, finish_export, record_final_state
from recipes import platform, titan
from recipes.errors import RecipeError


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
            # wall-clock end of the step: the launcher's time to the first step (harness.launch.speed).
            "unix_s": time.time(),
        }
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        return None


def write_provenance(opts: RunOptions, config, path: Path) -> None:
    """The run's provenance (harness.config.provenance), and how this rank started (``rank_start``)."""

    allowed = [m for m in mismatches(opts, config) if m.name in opts.allow_mismatch]
    record = {
        **provenance.provenance(opts, config, allowed),
        "rank_start": RANK_START,
        "threads": torch.get_num_threads(),
    }
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")


#: How this rank's process started, as seen at its entry: "preloaded" when torchtitan's trainer
#: was already imported (forked from harness.launch.elastic's forkserver), else "exec" (a fresh interpreter).
RANK_START = "exec"
PRELOAD_MARKER = "torchtitan.trainer"


def record_steps(trainer, path: Path) -> None:
    """Add a StepRecorder beside whatever loggers torchtitan configured (maybe none), through the declared hook."""

    def beside(logger):
        loggers = titan.LoggerContainer()
        loggers.add_logger(logger)
        loggers.add_logger(StepRecorder(path))
        return loggers

    titan.wrap_hook(trainer.metrics_processor, "MetricsProcessor.logger", beside)


def score_step1(trainer, config, run_dir: Path | None) -> None:
    """Step 1 forward-only (``harness.rank.step1_forward``, bitwise the trainer's step-1 loss), recorded as step 1."""

    started = time.perf_counter()
    record = step1_forward.step_record(step1_forward.score_built(trainer, config, started), started)
    if run_dir is not None:
        with (run_dir / STEPS_FILE).open("a") as f:
            f.write(json.dumps(record) + "\n")


def beat_every_step(trainer, run_dir: Path) -> None:
    """A heartbeat after each of the trainer's steps (the declared hook ``Trainer.train_step``), with its time."""

    def wrap(original):
        last = [time.perf_counter()]

        def train_step(*args, **kwargs):
            out = original(*args, **kwargs)
            now = time.perf_counter()
            watchdog.beat(run_dir, "step", trainer.step, now - last[0])
            last[0] = now
            return out

        return train_step

    titan.wrap_hook(trainer, "Trainer.train_step", wrap)


def train(opts: RunOptions, cli_overrides: list[str] = ()) -> None:
    """Build the recipe and train it in this process (one torchrun rank)."""

    config = build_config(
        opts, cli_overrides
    )  # the launcher checked it before any rank started (run.json)
    rank = int(os.environ.get("RANK", "0"))
    faults.at_start(rank)
    run_dir = Path(config.dump_folder)
    trainer = None
    try:
        trainer = config.build()
        watchdog.beat(opts.run_dir, "built")
        if rank == 0:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / STEPS_FILE).unlink(missing_ok=True)
            record_steps(trainer, run_dir / STEPS_FILE)
        if rank == 0:
            write_provenance(opts, config, run_dir / PROVENANCE_FILE)
        faults.install(trainer, rank)
        first_batch.install(
            trainer, opts, run_dir, rank
        )  # --init hf: step 1's batches, for the host's reference loss
        beat_every_step(
            trainer, opts.run_dir
        )  # outermost: a fault or hang inside a step leaves no beat
        if opts.forward_only:
            score_step1(trainer, config, run_dir if rank == 0 else None)
        else:
            trainer.train()
        watchdog.beat(opts.run_dir, "finish")
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


def _error_handler():
    """torch elastic's error handler, with this rank's number in what it records.

    torchrun (torch/distributed/elastic/multiprocessing/api.py) gives each rank its
    own ``TORCHELASTIC_ERROR_FILE``; ``@record`` writes the rank's exception there
    and torchrun's own ``@record`` copies the first failure's file to torchrun's
    ``TORCHELASTIC_ERROR_FILE`` (errors/__init__.py ``record``, error_handler.py
    ``dump_error_file``). The file holds no rank number, so this adds it.
    """

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

    handler = _error_handler()
    return record(_main, error_handler=handler)(argv, handler)


def _main(argv: list[str] | None, errors) -> int:
    parser = argparse.ArgumentParser(
        prog="harness.rank.train", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--run-dir", type=Path, required=True, help="the run's directory, holding its run.json"
    )
    args, cli_overrides = parser.parse_known_args(argv)

    try:
        opts = read_run_options(args.run_dir.resolve())
        watchdog.beat(opts.run_dir, "start")
        platform.install(opts.tier)
        train(opts, cli_overrides)
    except RecipeError as e:
        # One line, no traceback; the error file carries it to the launcher's summary.
        print(f"harness.rank.train: error: {e}", file=sys.stderr)
        errors.record_exception(e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
