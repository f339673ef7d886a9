"""What a run really used: tokenizer, weights, model, RoPE, data and inputs, recorded for the report.

It refuses nothing: a run whose pieces disagree was refused before launch (harness/checks/mismatch.py);
what the user allowed with ``--allow-mismatch`` is recorded here as a warning the report repeats.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
from pathlib import Path

from tokenizers import Tokenizer

from harness.base.run_dir import PROVENANCE_FILE, read_provenance
from harness.checks.mismatch import Mismatch, built_dims
from harness.declare import catalogue
from harness.options.run_options import RunOptions
from recipes.kernels import experts_in_use, rope_in_use
from recipes.kernels import rope_gathers as probe
from recipes.platform.torchtitan_checkout import checkout_info
from recipes.registry import get_recipe


def sha256_of(paths: list[Path], header_only: bool = False) -> str:
    """One digest over files; for safetensors only the header (names, dtypes, shapes, offsets)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode())
        with path.open("rb") as f:
            if header_only:
                length = f.read(8)
                digest.update(length + f.read(int.from_bytes(length, "little")))
            else:
                digest.update(f.read())
    return digest.hexdigest()


def dataset_files(dataset_dir: Path) -> list[Path]:
    """The files the data loader reads: ``*.jsonl`` and ``*.json`` (both JSON lines), as preflight checks them."""
    return sorted(
        p for pattern in ("*.jsonl", "*.json") for p in dataset_dir.glob(pattern) if p.is_file()
    )


def dataset_info(dataset_dir: Path) -> dict:
    """Path, files and one content digest of a run's corpus: a step-1 loss is only comparable on the same text.

    The digest covers every file's name, size and bytes (streamed, so a large corpus
    costs one read and no memory); two runs with equal digests read the same data.
    """
    files = dataset_files(dataset_dir)
    digest = hashlib.sha256()
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.name}\0{size}\0".encode())
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return {
        "path": str(dataset_dir),
        "files": [{"name": p.name, "bytes": p.stat().st_size} for p in files],
        "sha256": digest.hexdigest() if files else None,
    }


def tokenizer_info(tokenizer_dir: Path) -> dict:

    files = [
        p
        for p in (tokenizer_dir / "tokenizer.json", tokenizer_dir / "tokenizer_config.json")
        if p.is_file()
    ]
    return {
        "path": str(tokenizer_dir),
        "vocab_size": Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size(),
        "sha256": sha256_of(files),
    }


def weights_info(opts: RunOptions) -> dict | None:
    if opts.init != "hf" or opts.model_dir is None:
        return None
    files = sorted(opts.model_dir.glob("*.safetensors"))
    index = sorted(opts.model_dir.glob("*.safetensors.index.json"))
    return {
        "path": str(opts.model_dir),
        "files": [p.name for p in files],
        "headers_sha256": sha256_of(files, header_only=True),
        "index_sha256": sha256_of(index) if index else None,
    }


#: Where file digests are kept between runs, keyed by path, size, mtime and inode: a trn2 night
#: hashes the 8 GB of Qwen3-4B weights once, not once per launch.
DIGEST_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "qwen3-trn-repro"
    / "sha256.json"
)


def file_sha256(path: Path, cache: dict | None = None) -> str:
    """sha256 of one file's bytes (streamed); reused from ``cache`` while the file's stat is unchanged."""
    stat = path.stat()
    key = str(path.resolve())
    stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
    if cache is not None and cache.get(key, {}).get("stat") == stamp:
        return cache[key]["sha256"]
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    if cache is not None:
        cache[key] = {"stat": stamp, "sha256": digest.hexdigest()}
    return digest.hexdigest()


def _digests(files: list[Path], cache: dict) -> dict[str, str]:
    return {p.name: file_sha256(p, cache) for p in files}


def input_files(
    opts: RunOptions, tokenizer_dir: Path | None = None, dataset_dir: Path | None = None
) -> dict:
    """The files a run reads, by role: weights (*.safetensors + index), config.json, tokenizer, dataset."""
    tokenizer_dir = (
        Path(tokenizer_dir or opts.tokenizer_dir) if (tokenizer_dir or opts.tokenizer_dir) else None
    )
    dataset_dir = (
        Path(dataset_dir or opts.dataset_dir) if (dataset_dir or opts.dataset_dir) else None
    )
    model_dir = opts.model_dir if opts.init == "hf" else None
    weights = (
        sorted([*model_dir.glob("*.safetensors"), *model_dir.glob("*.safetensors.index.json")])
        if model_dir
        else []
    )
    config = (
        [model_dir / "config.json"] if model_dir and (model_dir / "config.json").is_file() else []
    )
    tokenizer = (
        [p for p in sorted(tokenizer_dir.glob("tokenizer*")) if p.is_file()]
        if tokenizer_dir
        else []
    )
    return {
        "weights": weights,
        "config.json": config,
        "tokenizer": tokenizer,
        "dataset": dataset_files(dataset_dir) if dataset_dir else [],
    }


def input_key(
    opts: RunOptions,
    kept_defects: list[str] = (),
    tokenizer_dir: Path | None = None,
    dataset_dir: Path | None = None,
) -> dict:
    """What a golden keyed by inputs records: sha256 of every input file, the allowed mismatches, the kept defects.

    Two runs with equal keys read the same bytes under the same accepted deviations;
    ``tokenizer_dir`` / ``dataset_dir`` name what the config really read when it differs
    from ``opts`` (torchtitan's own defaults).
    """

    cache = {}
    if DIGEST_CACHE.is_file():
        with contextlib.suppress(ValueError, OSError):
            cache = json.loads(DIGEST_CACHE.read_text())
    files = input_files(opts, tokenizer_dir, dataset_dir)
    key = {role: _digests(paths, cache) for role, paths in files.items()}
    key["allow_mismatch"] = sorted(opts.allow_mismatch)
    key["kept_defects"] = sorted(kept_defects)
    with contextlib.suppress(OSError):
        DIGEST_CACHE.parent.mkdir(parents=True, exist_ok=True)
        tmp = DIGEST_CACHE.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache))
        tmp.replace(DIGEST_CACHE)
    return key


def run_kept_defects(opts: RunOptions) -> list[str]:
    """The upstream defects this launch keeps (``$QWEN3_HF_KEEP_DEFECTS``, for a recipe with a lane that keeps
    some, ``harness.declare.catalogue``; every rank inherits it)."""

    if not catalogue.entry(opts.recipe).keeps_defects or not os.environ.get(
        "QWEN3_HF_KEEP_DEFECTS"
    ):
        return []
    from recipes.hf_as_published import kept_defects  # noqa: PLC0415 -- heavy: recipes.hf_as_published imports torchtitan (torchtitan+torch 2.9 s); this module stays light

    return kept_defects()


def add_input_key(run_dir: Path, opts: RunOptions) -> dict:
    """Hash the run's inputs on the host (never on a rank: 8 GB of weights) into ``provenance.json``; return the key.

    Only into a provenance.json rank 0 wrote whole: a missing or partial one (ranks that died
    early, ``harness.base.run_dir.provenance_state``) is left as it is, and the key is still returned.
    """

    key = input_key(opts, run_kept_defects(opts))
    record = read_provenance(run_dir)
    if record:
        text = json.dumps({**record, "inputs": key}, indent=2, default=str) + "\n"
        (Path(run_dir) / PROVENANCE_FILE).write_text(text)
    return key


def rope_used(config) -> dict[str, list[int]]:
    """Which RoPE each layer runs ({description: layers}); {} for the HF backend's own."""

    return rope_in_use(config)


def rope_gathers(config) -> dict[str, list[str]]:
    """The per-position gathers each RoPE runs ({description: aten ops}); all empty = "RoPE without gather"."""

    return probe(config)


def overrides_applied(config) -> dict[str, list[str]]:
    """Which nodes each kernel override replaced ({name: [model-relative fqns]}), read from the config."""
    from recipes.overrides import replaced_nodes  # noqa: PLC0415 -- heavy: recipes.overrides imports torchtitan (torchtitan+torch 2.9 s); this module stays light

    return replaced_nodes(config)


def provenance(opts: RunOptions, config, allowed: list[Mismatch] = ()) -> dict:
    """Everything that decides a step-1 loss, as this run really has it."""
    dp = int(os.environ.get("WORLD_SIZE", opts.nproc * opts.nnodes))  # data parallel only (TP=1)
    return {
        "tokenizer": tokenizer_info(Path(config.hf_assets_path)),
        "weights": weights_info(opts),
        "model": built_dims(config),
        "rope": rope_used(config),
        "rope_gather_ops": rope_gathers(config),
        "experts": experts_in_use(config),
        "overrides": overrides_applied(config),
        "data": {
            **dataset_info(Path(config.dataloader.dataset_path)),
            "seq_len": config.training.seq_len,
            "local_batch_size": config.training.local_batch_size,
            "global_batch_size": config.training.local_batch_size * dp,
        },
        "seed": config.debug.seed,
        "dtype": {
            "params": config.training.mixed_precision_param,
            "export": config.checkpoint.export_dtype,
        },
        "allowed_mismatches": [m.message for m in allowed],
        "allowed_mismatch_names": [m.name for m in allowed],
        **({"torchtitan_neuron": torchtitan_neuron()} if opts.tier == "trn2" else {}),
        **({"config_source": config_source(opts.recipe, opts.tier)} if forked(opts.recipe) else {}),
    }


def torchtitan_neuron() -> dict:
    """The TorchTitan Neuron ref and commit this interpreter runs (recipes/platform/torchtitan_checkout.py)."""

    return checkout_info()


def forked(recipe: str) -> bool:
    """The recipe's tutorial config is the fork's own function when importable (its catalogue entry's ``fork``)."""

    return catalogue.entry(recipe).fork is not None


def config_source(recipe: str, tier: str) -> str:
    """Which function built a forked recipe's config: the fork's own or the suite's twin (its module says)."""

    return importlib.import_module(get_recipe(recipe).module).config_source(tier)
