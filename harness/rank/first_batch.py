"""The first batch of a weights-loaded run, recorded on every rank for the host's reference loss.

Rank stage: ``harness.rank.train`` calls :func:`install` on every rank of an ``--init hf``
run; each rank writes the batches its step 1 consumed, how the model attends and the
RoPE inverse frequencies it really holds (``first_batch/rankNNNNN.safetensors``).
The judge (:mod:`harness.reference.diagnosis`) reads them back with :func:`load_record` after
every rank has ended.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open

from harness.base.run_dir import RECORD_DIR  # noqa: F401 -- the run directory's names (harness.base.run_dir)
from recipes import titan

#: torchtitan's and transformers' "no loss here" label (torchtitan.components.loss.IGNORE_INDEX).
IGNORE_INDEX = -100
#: How the model attended over a packed window.
#: "causal": every token sees every earlier token of the window, documents included (SDPA
#:   ``is_causal``: what torchtitan's SDPA and the HF backend's causal attention compute);
#: "document": only earlier tokens of its own document (Flex/Varlen block-causal masks).
ATTENTIONS = ("causal", "document")


def install(trainer, opts, run_dir: Path, rank: int) -> None:
    """Record the batches step 1 consumes on this rank, for runs that load weights.

    Wraps the declared hook ``Trainer.batch_generator`` (``Trainer.train`` calls it; wrap_hook
    refuses a trainer without it, never a run with no record): the first ``gradient_accumulation_steps
    × num_pipeline_parallel_microbatches`` batches are the ones ``train_step`` sums into the step-1
    loss. They are written when the first step fetches them, after the checkpoint load, so the
    RoPE frequencies recorded are the ones step 1 runs with.
    """

    if opts.init != "hf":
        return
    dims = trainer.parallel_dims
    if (dims.tp, dims.cp, dims.pp) != (1, 1, 1):
        return  # each rank's batch is one data-parallel shard only when TP, CP and PP are 1
    count = trainer.gradient_accumulation_steps * trainer.num_pipeline_parallel_microbatches

    def recording(generate):
        def batch_generator(data_iterable):
            batches = generate(data_iterable)
            first = [next(batches) for _ in range(count)]
            # Fetched inside step 1 (Trainer.train increments step first). A run resumed from a
            # torchtitan checkpoint starts later and holds weights other than --model-dir's: no record.
            if trainer.step == 1:
                write_rank_record(
                    Path(run_dir) / RECORD_DIR, rank, dims.world_size, first, trainer.model_parts[0]
                )
            yield from first
            yield from batches

        return batch_generator

    titan.wrap_hook(trainer, "Trainer.batch_generator", recording)


def write_rank_record(directory: Path, rank: int, world: int, batches, model) -> Path:
    """``rank<R>.safetensors``: each batch's input/positions/labels, and the RoPE the model holds."""
    from safetensors.torch import save_file  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light

    tensors = {}
    for i, (input_dict, labels) in enumerate(batches):
        tensors[f"input.{i}"] = input_dict["input"]
        if input_dict.get("positions") is not None:
            tensors[f"positions.{i}"] = input_dict["positions"]
        tensors[f"labels.{i}"] = labels
    inv_freq = held_inv_freq(model)
    if inv_freq is not None:
        tensors["inv_freq"] = inv_freq
    metadata = {
        "rank": str(rank),
        "world": str(world),
        "batches": str(len(batches)),
        "attention": attention_of(model),
        # recipes.hf_as_published: upstream defects this run kept on purpose (the "as published" lanes)
        "kept_defects": os.environ.get("QWEN3_HF_KEEP_DEFECTS", ""),
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"rank{rank:05d}.safetensors"
    tmp = path.with_suffix(".tmp")
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata
    )
    tmp.replace(path)
    return path


def _local(tensor):
    full = getattr(tensor, "full_tensor", None)
    return (full() if full is not None else tensor).detach().float().cpu()


def held_inv_freq(model):
    """The RoPE inverse frequencies ``model`` really holds (first rotary module), or None.

    transformers' rotary modules keep an ``inv_freq`` buffer; torchtitan's CosSinRoPE
    keeps a ``cache`` of cos/sin rows ``[cos(p·f), cos(p·f), sin(p·f), sin(p·f)]``, whose
    row 1 gives ``f = atan2(sin, cos)`` (every Qwen3 frequency is ≤ 1 < π).
    """
    import torch  # noqa: PLC0415 -- heavy: torch 2.9 s; this module stays light

    for module in model.modules():
        buffer = getattr(module, "inv_freq", None)
        if isinstance(buffer, torch.Tensor):
            return _local(buffer)
    for module in model.modules():
        cache = getattr(module, "cache", None)
        if "RoPE" in type(module).__name__ and isinstance(cache, torch.Tensor) and cache.dim() == 2:
            cache = _local(cache)
            half = (
                cache.shape[-1] // 4
            )  # cache row: 2·dim values, dim = head_dim, dim/2 frequencies
            return torch.atan2(cache[1, 2 * half : 3 * half], cache[1, :half])
    return None


def attention_of(model) -> str:
    """ "causal" or "document" (see :data:`ATTENTIONS`), from the model the run built.

    torchtitan 0.3.0 ``Trainer.post_dataloading_process`` builds document masks only for
    ``FlexAttention`` / ``VarlenAttention`` inner attention (SDPA runs ``is_causal``); the
    Transformers backend's mask follows its config's ``attn_mask_type`` ("block_causal" is
    per document). Names are compared, not imported: no torchtitan import on this path.
    """
    hf_model = getattr(model, "model", None)
    if hf_model is not None and hasattr(hf_model, "config") and hasattr(hf_model, "lm_head"):
        return (
            "document"
            if getattr(hf_model.config, "attn_mask_type", "causal") == "block_causal"
            else "causal"
        )
    config = getattr(model, "config", None)
    attention = getattr(config, "first_attention", None) if config is not None else None
    inner = type(getattr(attention, "inner_attention", None)).__qualname__
    return "document" if inner in ("FlexAttention.Config", "VarlenAttention.Config") else "causal"


# --- reading a record, on the host -----------------------------------------------------------


@dataclass
class Record:
    """A run's step-1 global batch: one (input, positions, labels) per data-parallel row set."""

    batches: list[dict]
    attention: str
    #: The RoPE inverse frequencies the run's model held at step 1 (rank 0), or None; each
    #: batch also carries its own rank's as ``held_inv_freq`` (recorded runs).
    inv_freq: object
    ranks: int
    #: Upstream defects the run kept on purpose (``QWEN3_HF_KEEP_DEFECTS``), e.g. ["inv_freq"].
    kept_defects: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in self.batches)


def load_record(run_dir: Path) -> Record | None:
    """The run's recorded first batch (None when it recorded none); refuses a partial one."""

    directory = Path(run_dir) / RECORD_DIR
    paths = sorted(directory.glob("rank*.safetensors"))
    if not paths:
        return None
    batches, attentions, inv_freq, world, kept = [], set(), None, None, ""
    for path in paths:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
            world = int(meta["world"])
            attentions.add(meta["attention"])
            kept = meta.get("kept_defects", "")
            names = set(f.keys())
            held = f.get_tensor("inv_freq") if "inv_freq" in names else None
            for i in range(int(meta["batches"])):
                batches.append(
                    {
                        "input": f.get_tensor(f"input.{i}"),
                        "positions": f.get_tensor(f"positions.{i}")
                        if f"positions.{i}" in names
                        else None,
                        "labels": f.get_tensor(f"labels.{i}"),
                        # each rank's own: uninitialised memory differs from rank to rank
                        "held_inv_freq": held,
                    }
                )
            if inv_freq is None:
                inv_freq = held
    if len(paths) != world:
        raise IncompleteRecord(
            f"{directory} holds {len(paths)} rank record(s) of a {world}-rank run: the global batch is incomplete "
            "(a multi-node run without a shared --run-dir keeps each node's ranks on that node)"
        )
    if len(attentions) != 1:
        raise ReferenceError(f"{directory}: ranks disagree on attention {sorted(attentions)}")
    return Record(
        batches=batches,
        attention=attentions.pop(),
        inv_freq=inv_freq,
        ranks=world,
        kept_defects=[d for d in kept.split(",") if d],
    )


class ReferenceError(RuntimeError):
    """A record or weights directory the reference cannot be computed from."""


class IncompleteRecord(ReferenceError):
    """Not every rank's batch is in this run directory: nothing is wrong with the run itself."""
