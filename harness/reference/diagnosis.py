"""Step-1 loss, explained: the run's own first batch scored by transformers on the host.

A step-1 loss from loaded weights only says something when we know what those
weights *should* score on that batch. Every run that loads weights (``--init hf``)
records, on every rank, the batches its step 1 consumed (token ids, labels, the
per-document positions torchtitan's loader hands RoPE), how the model attends
(causal over the whole packed window, or per document), and the RoPE inverse
frequencies the model really holds after init and checkpoint load. After the
launch, the harness scores exactly those tokens with transformers'
``AutoModelForCausalLM`` from the same weights directory, in fp32 on the host
CPU, outside torchtitan and outside the device, averaged as torchtitan averages
(every rank's token sum / the global valid-token count).

The verdict compares the measured step-1 loss with that reference under a
stated per-tier tolerance (:data:`TOLERANCES`). When the measured loss is above
(or below) the reference by more than the tolerance, or a weights-loaded loss is
implausible for a trained model (above :data:`PLAUSIBLE_FRACTION` × ln V), the
diagnosis measures the suspects that are cheap to test on the host, each as its
effect on the reference (:func:`diagnose`):

* ``tokenizer``: the run's tokenizer (``hf_assets_path``) is not the weights'
  own; the same text is re-packed with the model directory's tokenizer and scored.
* ``rope_theta``: the run's RoPE theta is not config.json's; the batch is scored
  with the run's theta.
* ``inv_freq``: the RoPE inverse frequencies the run's model held are not what
  its own theta gives (torchtitan issue 4783: the Transformers backend leaves
  ``inv_freq`` as ``to_empty()`` memory); the batch is scored with the held ones.

When step 1 disagrees with the reference (or the run asked with ``--localize``), the same
first rows go through the run's torchtitan model and transformers' model side by side and the
check names the first module whose output differs (:mod:`harness.reference.localize`).

``python -m harness.reference.diagnosis RUN_DIR`` prints the check of one run;
``python -m harness.reference.diagnosis cost`` measures what the reference costs per
token and layer at the real 4B width on this CPU and extrapolates to a trn2
global batch (``cost --localize``: what the layer-by-layer localizer costs there).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import sys
import time
from pathlib import Path

from harness.base.readable import kind_of
from harness.rank.first_batch import (  # noqa: F401 -- the record's names, where the reference's users look for them
    ATTENTIONS,
    IGNORE_INDEX,
    RECORD_DIR,
    IncompleteRecord,
    Record,
    ReferenceError,
    attention_of,
    held_inv_freq,
    install,
    load_record,
    write_rank_record,
)
from harness.reference.cost import TRN2_GLOBAL_ROWS, measure_cost, measure_localize_cost  # noqa: F401 -- python -m harness.reference cost [--localize]
from harness.reference.scoring import *  # noqa: F401,F403 -- primitives, tolerances, ReferenceCheck
from harness.reference.scoring import (
    ReferenceCheck,
    Tolerance,
    batch_loss,
    load_reference_model,
    tolerance_for,
)
from harness.reference.suspects import *  # noqa: F401,F403 -- the suspects and RunInfo
from harness.reference.suspects import RunInfo
from harness.reference.suspects import diagnose as diagnose_suspects


def check(
    run: RunInfo,
    record: Record,
    model=None,
    tolerance: Tolerance | None = None,
    always_diagnose: bool = False,
    localize: bool = False,
    diagnose: bool = True,
    known_reference: float | None = None,
) -> ReferenceCheck:
    """Reference loss of ``record`` from ``run``'s weights, the verdict, and the diagnosis when needed.

    The layer-by-layer localization costs two more forwards and a torchtitan model on the host:
    it runs only when the measured loss disagrees, or on request (``localize``, or the run's
    ``--localize``). ``diagnose=False``: neither suspects nor localization (the caller carries a
    standing explanation, ``harness.night.standing``); ``known_reference``: this batch's reference loss,
    already scored tonight for another run that fed the same tokens.
    """
    started, cpu_started = time.perf_counter(), time.process_time()
    model = model if model is not None else load_reference_model(Path(run.model_dir))
    loaded = time.perf_counter()
    reference = (
        known_reference
        if known_reference is not None
        else batch_loss(model, record.batches, record.attention)
    )
    scored = time.perf_counter()
    tolerance = tolerance or tolerance_for(run.tier, Path(run.model_dir), run.recipe)
    result = ReferenceCheck(
        measured=run.measured,
        reference=reference,
        tolerance=tolerance.value,
        tolerance_reason=tolerance.reason,
        vocab_size=model.config.vocab_size,
        tokens=record.tokens,
        ranks=record.ranks,
        attention=record.attention,
        model_dir=str(run.model_dir),
        kept_defects=list(record.kept_defects),
        judged=tolerance.measured,
    )
    if diagnose and (result.needs_diagnosis or always_diagnose):
        result.suspects = diagnose_suspects(result, run, record, model)
    scored_suspects = time.perf_counter()
    if localize or getattr(run.options, "localize", False) or (diagnose and not result.agrees):
        result.localization = _localization(run, record, model)
    result.cost = {
        "load_s": loaded - started,
        "score_s": scored - loaded,
        "localize_s": time.perf_counter() - scored_suspects if result.localization else 0.0,
        "total_s": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu_started,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    return result


def _localization(run: RunInfo, record: Record, model) -> dict:
    """The first divergence, or why there is none to report (never lost: the check stands either way)."""
    from harness.reference.localize import localize_run  # noqa: PLC0415 -- heavy: harness.reference.localize imports torch (torch 2.9 s); this module stays light

    try:
        return localize_run(run, record, model).to_dict()
    except Exception as e:  # noqa: BLE001 -- reported in the check, which stands without it
        return {
            "error": f"{type(e).__name__}: {e}",
            "summary": f"not localized: {type(e).__name__}: {e}",
        }


def check_run_dir(
    run_dir: Path,
    tolerance: Tolerance | None = None,
    always_diagnose: bool = False,
    allow_no_step: bool = False,
    model=None,
    localize: bool = False,
    diagnose: bool = True,
    known_reference: float | None = None,
) -> ReferenceCheck | None:
    """The reference check of one run directory, or None when the run recorded no batch.

    ``model``: a ``load_reference_model`` of the run's weights directory, to reuse across runs.
    """
    record = load_record(run_dir)
    if record is None:
        return None
    run = RunInfo.from_run_dir(run_dir, allow_no_step=allow_no_step)
    return check(
        run,
        record,
        model=model,
        tolerance=tolerance,
        always_diagnose=always_diagnose,
        localize=localize,
        diagnose=diagnose,
        known_reference=known_reference,
    )


def batch_key(run_dir: Path) -> str | None:
    """sha256 of the run's recorded first batch (tokens, positions, labels, attention) and weights directory: two
    runs with the same key have the same reference loss, scored once."""

    record = load_record(run_dir)
    if record is None:
        return None
    run = RunInfo.from_run_dir(run_dir, allow_no_step=True)
    digest = hashlib.sha256(f"{Path(run.model_dir).resolve()}\0{record.attention}".encode())
    for batch in record.batches:
        for name in ("input", "positions", "labels"):
            if batch.get(name) is not None:
                digest.update(name.encode() + batch[name].contiguous().numpy().tobytes())
    return digest.hexdigest()


def summary(result: ReferenceCheck) -> str:
    text = (
        f"step-1 loss {result.measured:.7g} vs reference {result.reference:.7g} (transformers fp32 on the host, "
        f"{result.tokens} tokens of {result.ranks} rank(s)): Δ {result.difference:+.3g}, tolerance {result.tolerance:g}: "
        f"{result.verdict}"
    )
    diagnosis = result.diagnosis()
    text += f"\n  diagnosis: {diagnosis}" if diagnosis else ""
    return text + (
        f"\n  layer by layer: {result.localization['summary']}" if result.localization else ""
    )


def main(argv: list[str] | None = None) -> int:

    parser = argparse.ArgumentParser(
        prog="python -m harness.reference.diagnosis", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("what", help="a run directory, or 'cost'")
    parser.add_argument(
        "--diagnose", action="store_true", help="measure every suspect even when the verdict passes"
    )
    parser.add_argument(
        "--localize",
        action="store_true",
        help="compare torchtitan's and transformers' modules even when it passes; cost: the localizer's",
    )
    parser.add_argument("--config-dir", type=Path, help="cost: config.json to size the model from")
    parser.add_argument("--threads", type=int)
    args = parser.parse_args(argv)
    if args.what == "cost":
        from recipes.specs import QWEN3_4B_INSTRUCT_2507  # noqa: PLC0415 -- heavy: recipes.specs imports torch (torch 2.9 s); this module stays light

        measure = measure_localize_cost if args.localize else measure_cost
        print(
            json.dumps(
                measure(args.config_dir or QWEN3_4B_INSTRUCT_2507, threads=args.threads), indent=2
            )
        )
        return 0
    refused = "python -m harness.reference: error: "
    run_dir = Path(args.what)
    if not run_dir.is_dir():
        what = "a file" if run_dir.is_file() else (kind_of(run_dir) or "not a directory")
        print(
            f"{refused}{args.what} is {what}, not a run directory; pass REPORT_DIR/runs/NAME, or 'cost'",
            file=sys.stderr,
        )
        return 2
    try:
        result = check_run_dir(run_dir, always_diagnose=args.diagnose, localize=args.localize)
    except (ReferenceError, OSError, ValueError) as e:
        print(
            f"{refused}{e}; the reference scores a run that recorded its step 1: pass such a run directory",
            file=sys.stderr,
        )
        return 2
    if result is None:
        print(
            f"{refused}{args.what} recorded no first batch (random init, or TP/CP/PP > 1)",
            file=sys.stderr,
        )
        return 2
    print(summary(result))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
