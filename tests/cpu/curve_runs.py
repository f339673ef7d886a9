"""The 100-step runs the curve, parity, multinode and resume tests share (issue 15).

Each is launched once per session through ``recipe_run`` (its cache is shared by every
xdist worker); test modules wrap these functions in fixtures. All run on one process
where the claim allows (2 cores; launches, not steps, dominate the suite's time).
"""

from __future__ import annotations

import json
from pathlib import Path

from filelock import FileLock

from recipes.tiers import CPU

STEPS = 100
#: The native run saves a full torchtitan checkpoint here (and its HF export at step 100):
#: the resume tests load weights from it.
CHECKPOINT_STEP = 50

NATIVE = dict(recipe="native_qwen3", tier="cpu", nproc=1, steps=STEPS, init="hf", seed=0)
HF_BACKEND = dict(
    recipe="hf_backend", tier="cpu", nproc=1, steps=STEPS, init="hf", seed=0, export=False
)
NKI_MOE = dict(
    recipe="nki_moe", tier="cpu", nproc=1, steps=STEPS, init="random", seed=0, export=False
)


def native_curve(recipe_run) -> dict:
    """native_qwen3 from the fixture weights, 1 process × 2 × 256 tokens, 100 steps; checkpoint at step 50."""
    return recipe_run(
        "curve-native-1proc",
        cli_overrides=["--checkpoint.interval", str(CHECKPOINT_STEP)],
        **NATIVE,
    )


def hf_backend_curve(recipe_run) -> dict:
    """hf_backend as the tutorial configures it (transformers_modeling_backend_full()), same weights and data."""
    return recipe_run("curve-hf-backend-1proc", **HF_BACKEND)


def hf_backend_native_schedule(recipe_run) -> dict:
    """hf_backend with native_qwen3's LR schedule: linear decay right after warmup (decay_ratio None).

    transformers_modeling_backend_full() sets ``decay_ratio=0.8`` (warmup, stable, then decay
    over the last 80 %); qwen3_32b() leaves it None. That is the only optimizer difference
    between the two recipes (tests/cpu/test_curves.py checks the configs).
    """
    return recipe_run(
        "curve-hf-backend-native-schedule",
        cli_overrides=["--lr_scheduler.decay_ratio", "None"],
        **HF_BACKEND,
    )


def nki_moe_curve(recipe_run) -> dict:
    """nki_moe from torchtitan's random init, seed 0, 1 process × 2 × 256 tokens, 100 steps."""
    return recipe_run("curve-nki-moe-1proc", **NKI_MOE)


# --- the same global batch on 1 and on 2 processes --------------------------------------------------

#: Processes × sequences per process of the 2-process run; the 1-process run takes all of them.
SAME_BATCH_NPROC, SAME_BATCH_LOCAL = 2, 2
#: Documents per rank beyond what 100 steps read, so no rank re-loops (a re-loop reshuffles).
SPARE_STEPS = 2


def _exact_documents(count: int, seq_len: int) -> list[str]:
    """``count`` texts of exactly ``seq_len`` tokens each (the fixture tokenizer, no EOS).

    torchtitan's text dataset appends EOS and packs documents into sequences of seq_len
    inputs; a document of seq_len tokens + EOS fills exactly one sequence, so each
    sequence is one whole document and the order of documents is the order of sequences.
    Words of the fixture corpus are taken in order (a word adds ≥ 1 token, so the count is
    monotone in the number of words), then dots pad to the exact length.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(CPU.tokenizer_dir / "tokenizer.json"))
    words = []
    with (CPU.dataset_path / "train.jsonl").open() as corpus:
        for line in corpus:
            words += json.loads(line)["text"].split()

    def tokens(text: str) -> int:
        return len(tokenizer.encode(text).ids)

    docs, start = [], 0
    while len(docs) < count:
        lo, hi = 1, seq_len  # the longest run of words from `start` within seq_len tokens
        while lo < hi:
            mid = (lo + hi + 1) // 2
            text = " ".join(words[(start + i) % len(words)] for i in range(mid))
            lo, hi = (mid, hi) if tokens(text) <= seq_len else (lo, mid - 1)
        text = " ".join(words[(start + i) % len(words)] for i in range(lo))
        start += lo
        while tokens(text) < seq_len:
            text += "."
        if tokens(text) == seq_len:  # a dot that merged past the length: skip this one
            docs.append(text)
    return docs


def same_batch_corpora(shared_dir: Path, seq_len: int = CPU.seq_len) -> tuple[Path, Path]:
    """(1-process corpus, 2-process corpus): the same sequences in the same global batches.

    torchtitan gives data-parallel rank r the r-th contiguous half of the documents
    (datasets' split_dataset_by_node on a map-style dataset). With one document per
    sequence, the 2-process run's step s reads documents 2s, 2s+1 (rank 0) and M+2s,
    M+2s+1 (rank 1); the 1-process corpus lists exactly those four per step, in that order.
    """
    root = shared_dir / "same-batch-corpora"
    one, two = root / "one-process", root / "two-processes"
    with FileLock(str(root) + ".lock"):
        if not (one / "train.jsonl").exists():
            per_rank = SAME_BATCH_LOCAL * (STEPS + SPARE_STEPS)
            docs = _exact_documents(SAME_BATCH_NPROC * per_rank, seq_len)
            ranks = [docs[r * per_rank : (r + 1) * per_rank] for r in range(SAME_BATCH_NPROC)]
            interleaved = [
                doc
                for step in range(STEPS + SPARE_STEPS)
                for rank in ranks
                for doc in rank[step * SAME_BATCH_LOCAL : (step + 1) * SAME_BATCH_LOCAL]
            ]
            for path, texts in ((two, docs), (one, interleaved)):
                path.mkdir(parents=True, exist_ok=True)
                (path / "train.jsonl").write_text(
                    "".join(json.dumps({"text": t}) + "\n" for t in texts)
                )
    return one, two


def same_batch_options(shared_dir: Path, nproc: int) -> dict:
    """native_qwen3, fixture weights, 100 steps, 4 sequences per step on 1 or 2 processes."""
    one, two = same_batch_corpora(shared_dir)
    return dict(
        recipe="native_qwen3",
        tier="cpu",
        nproc=nproc,
        steps=STEPS,
        init="hf",
        seed=0,
        export=False,
        local_batch_size=SAME_BATCH_NPROC * SAME_BATCH_LOCAL // nproc,
        dataset_dir=one if nproc == 1 else two,
    )


def same_batch_run(recipe_run, shared_dir: Path, nproc: int) -> dict:
    return recipe_run(f"same-batch-{nproc}proc", **same_batch_options(shared_dir, nproc))
