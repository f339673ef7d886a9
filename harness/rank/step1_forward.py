"""Step 1's loss without step 1: the trainer's own model and first batch, scored forward-only.

A step-1 loss (random init, or weights just loaded) is a forward pass before any
update, so measuring it needs no backward pass, gradients or optimizer state: about
a third of a training step's FLOPs, and at the real 4B width a few GiB less memory.
What it must not do is score another model or another batch than the trainer would:

* the config is the run's (``harness.config.build.build_config``: the recipe's own config
  function, the run's deltas, kernel and torchtitan CLI overrides);
* the model, its parallelisms and its init are torchtitan's ``Trainer`` itself
  (``config.build()``: seed, meta build, ``parallelize_fn``, ``to_empty``,
  ``init_weights``), and ``checkpointer.load`` runs as ``Trainer.train`` runs it;
* the batch is the first one ``Trainer.train`` takes (``batch_generator`` over the
  trainer's dataloader, ``gradient_accumulation_steps`` microbatches);
* the loss is ``Trainer.train_step``'s forward half: ``post_dataloading_process``,
  the model under ``train_context``, ``loss_fn`` over the global valid-token count,
  summed over microbatches and over the loss mesh.

``tests/cpu/test_step1_forward.py`` holds it bitwise equal to the trainer's logged
step-1 loss. Run it as a rank (one process, or under torchrun like ``harness.rank.train``)::

    python -m harness.rank.step1_forward --run-dir DIR [--initial-state] [torchtitan CLI overrides]

``DIR/run.json`` holds resolved ``RunOptions`` (``harness.launch.lifecycle.write_run_file``);
rank 0 writes ``DIR/step1_forward.json`` and, with ``--initial-state``, the hashes of
the weights step 1 starts from (``harness.rank.export.record_final_state``'s format) to
``DIR/initial_state.json``. Nothing is trained or saved. The host side, runs it from the host (``harness.judge.proxy.run``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.base.run_dir import INITIAL_STATE_FILE, STEP1_FORWARD_FILE
from harness.options.run_options import read_run_options
from recipes import platform
from recipes.errors import RecipeError


@dataclass
class Step1Score:
    """Rank 0's view of one forward-only step 1."""

    #: The step-1 loss as the trainer logs it (``loss_metrics/global_avg_loss``).
    loss: float
    #: Labels that count, over all ranks (the loss's denominator).
    global_valid_tokens: int
    ranks: int
    #: The model built (``harness.checks.mismatch.built_dims``) and its parameter count.
    model: dict
    parameters: int
    #: Trainer build + checkpoint load, then the forward and loss alone.
    build_s: float
    score_s: float
    #: This process's CPU time and peak resident memory (rank 0).
    cpu_s: float
    max_rss_gib: float


class Step1ForwardError(RuntimeError):
    pass


def first_batches(trainer) -> list:
    """The microbatches ``Trainer.train_step`` takes for step 1, from the trainer's own dataloader."""
    data = trainer.batch_generator(trainer.dataloader)
    return [next(data) for _ in range(trainer.gradient_accumulation_steps)]


def global_valid_tokens(trainer, batches):
    """``train_step``'s denominator: labels not ignored, summed over the batch mesh."""
    import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light
    from torchtitan.components.loss import IGNORE_INDEX  # noqa: PLC0415 -- heavy: torchtitan+torch 2.9 s; this module stays light
    from torchtitan.distributed import utils as dist_utils  # noqa: PLC0415 -- heavy: torchtitan+torch 2.9 s; this module stays light

    local = torch.tensor(0, dtype=torch.int64)
    for _, labels in batches:
        local += (labels != IGNORE_INDEX).sum()
    dims = trainer.parallel_dims
    if dims.dp_enabled:
        return dist_utils.dist_sum_tensor(local.to(trainer.device), dims.get_mesh("batch"))
    return local.to(trainer.device)


def forward_loss(trainer, batches) -> tuple[float, int]:
    """``train_step``'s loss for ``batches`` (torchtitan 0.3.0), forward only: no backward, no optimizer step.

    Same calls in the same order as ``train_step`` → ``forward_backward_step`` →
    ``_forward_backward_body``; under ``no_grad`` the chunked loss takes its forward-only
    branch, which sums the same per-chunk losses.
    """
    import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light
    from torchtitan.distributed import utils as dist_utils  # noqa: PLC0415 -- heavy: torchtitan+torch 2.9 s; this module stays light

    dims = trainer.parallel_dims
    if dims.pp_enabled or len(trainer.model_parts) != 1:
        raise Step1ForwardError(
            "pipeline parallelism is not scored forward-only: its schedule owns the loss"
        )
    denominator = global_valid_tokens(trainer, batches)
    accumulated = None
    with torch.no_grad():
        for input_dict, labels in batches:
            input_dict = {
                k: v.to(trainer.device) if isinstance(v, torch.Tensor) else v
                for k, v in input_dict.items()
            }
            inputs, labels, extra = trainer.post_dataloading_process(
                input_dict, labels.to(trainer.device)
            )
            with trainer.train_context():
                pred = trainer.model_parts[0](inputs, **extra)
                loss_kwargs = {"positions": extra["positions"]} if "positions" in extra else {}
                loss, _ = trainer.loss_fn(pred, labels, denominator, **loss_kwargs)
                del pred
            loss = loss.detach()
            accumulated = loss.clone() if accumulated is None else accumulated.add_(loss)
    if dims.dp_cp_enabled:
        total = dist_utils.dist_sum(accumulated, dims.get_optional_mesh("loss"))
    else:
        total = float(accumulated.item())
    return float(total), int(denominator)


def score(config, initial_state: Path | None = None) -> Step1Score:
    """Build ``config``'s trainer, load as ``Trainer.train`` does, and score its first batch forward-only."""
    started = time.perf_counter()
    trainer = config.build()
    try:
        return score_built(trainer, config, started, initial_state)
    finally:
        trainer.close()


def score_built(trainer, config, started: float, initial_state: Path | None = None) -> Step1Score:
    """Load ``trainer``'s checkpoint as ``Trainer.train`` does, then score its first batch forward-only.

    ``started``: ``time.perf_counter()`` before the trainer was built (``build_s`` counts from it).
    """
    import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light

    from harness.checks.mismatch import built_dims  # noqa: PLC0415 -- heavy: harness.checks.mismatch imports torch (torch 2.9 s); this module stays light

    parameters = sum(p.numel() for p in trainer.model_parts[0].parameters())
    trainer.checkpointer.load(step=config.checkpoint.load_step)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    if initial_state is not None:
        from harness.rank.export import record_final_state  # noqa: PLC0415 -- heavy: harness.rank.export imports torch (torch 2.9 s); this module stays light

        record_final_state(trainer, initial_state, rank)
    built = time.perf_counter()
    loss, tokens = forward_loss(trainer, first_batches(trainer))
    scored = time.perf_counter()
    return Step1Score(
        loss=loss,
        global_valid_tokens=tokens,
        ranks=torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
        model=built_dims(config),
        parameters=parameters,
        build_s=built - started,
        score_s=scored - built,
        cpu_s=time.process_time(),
        max_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    )


def step_record(result: Step1Score, started: float) -> dict:
    """``result`` as a ``steps.jsonl`` line (``harness.rank.train.StepRecorder``'s keys), for a forward-only run.

    What a forward pass does not measure (gradient norm, TFLOPS) is None; the step time
    and tokens/s are the forward's own, marked by ``forward_only``.
    """
    return {
        "step": 1,
        "loss": result.loss,
        "grad_norm": None,
        "tokens_per_s": result.global_valid_tokens / result.ranks / result.score_s
        if result.score_s > 0
        else None,
        "step_time_s": result.score_s,
        "max_reserved_gib": result.max_rss_gib,
        "tflops": None,
        "mfu_pct": None,
        "wall_s": time.perf_counter() - started,
        "unix_s": time.time(),
        "forward_only": True,
        "global_valid_tokens": result.global_valid_tokens,
    }


def single_process_env() -> None:
    """The rendezvous variables torchtitan's trainer needs, for a run outside torchrun (a free local port)."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


def rank_main(argv: list[str]) -> int:
    """One rank: score the run in ``--run-dir`` forward-only; rank 0 writes the result."""
    parser = argparse.ArgumentParser(
        prog="harness.rank.step1_forward", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--run-dir", type=Path, required=True, help="a directory holding the run's run.json"
    )
    parser.add_argument(
        "--initial-state",
        action="store_true",
        help=f"also hash the weights step 1 starts from ({INITIAL_STATE_FILE})",
    )
    args, cli_overrides = parser.parse_known_args(argv)

    from harness.config.build import build_config  # noqa: PLC0415 -- heavy: harness.config.build imports torch (torch 2.9 s); this module stays light

    single_process_env()
    run_dir = args.run_dir.resolve()
    try:
        opts = read_run_options(run_dir)
        platform.install(opts.tier)
        result = score(
            build_config(opts, cli_overrides),
            run_dir / INITIAL_STATE_FILE if args.initial_state else None,
        )
    except RecipeError as e:
        print(f"harness.rank.step1_forward: error: {e}", file=sys.stderr)
        return 2
    import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light

    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    if rank == 0:
        (run_dir / STEP1_FORWARD_FILE).write_text(json.dumps(asdict(result), indent=2) + "\n")
        print(
            f"step-1 loss (forward only) {result.loss!r} over {result.global_valid_tokens} tokens, {result.ranks} rank(s)"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return rank_main(argv)


if __name__ == "__main__":
    sys.exit(main())
