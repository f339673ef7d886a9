"""Every file a run reads, checked before launch (the directories it writes: ``targets.py``).

Each refusal is one line naming the path, what is wrong with it and the fix. Each file
is read with the library the run itself reads it with (``json``, ``safetensors``
headers, ``tokenizers``, ``datasets``' own choice of data files), so what passes here
loads on every rank. A leaf of the harness: ``harness.checks.preflight`` maps a run's options
to paths and calls these; nothing here imports the harness but its error type (``harness.checks.errors``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from safetensors import SafetensorError, safe_open
from tokenizers import Tokenizer

from harness.checks.errors import PreflightError
from recipes import hf_config
from recipes.hf_config import CONFIG_FIX
from recipes.registry import MODEL_TYPES, RECIPES


def one_line(error: BaseException) -> str:
    """A library's error message on one line (some span several)."""
    return " ".join(str(error).split()) or type(error).__name__


# --- JSON files ------------------------------------------------------------------------------


def read_json_object(path: Path, fix: str) -> dict:
    """``path`` parsed as one JSON object (``recipes.hf_config.read_json_object``), or a ``PreflightError``."""
    return hf_config.read_json_object(path, fix, PreflightError)


def check_model_config(path: Path, hf: dict, recipe: str, init: str) -> None:
    """config.json describes a model ``recipe`` trains, with every key that model is built from.

    The accepted ``model_type`` values and the keys each needs are declared with the recipes
    (``recipes.registry``): a Llama or Qwen3-MoE config.json under a dense recipe would
    otherwise train as Qwen3 and be scored against another model on the host.
    """

    accepted = RECIPES[recipe].model_types
    model_type = hf.get("model_type")
    if model_type not in accepted:
        trains = " or ".join(f"{t!r} ({MODEL_TYPES[t][0]})" for t in accepted)
        others = [
            r.name for r in RECIPES.values() if model_type in r.model_types and init in r.inits
        ]
        instead = f", or run recipe {' or '.join(others)} on it" if others else ""
        said = f": model_type is {model_type!r}" if "model_type" in hf else " has no model_type"
        raise PreflightError(
            f"{path}{said}, recipe {recipe!r} trains model_type {trains} only; "
            f"point --model-dir at a {' or '.join(MODEL_TYPES[t][0] for t in accepted)} checkpoint{instead}"
        )
    architecture, keys = MODEL_TYPES[model_type]
    architectures = hf.get("architectures")
    if architectures is not None and architectures != [architecture]:
        raise PreflightError(
            f"{path}: architectures {architectures} disagree with model_type {model_type!r} ({architecture}); "
            f"{CONFIG_FIX}"
        )
    for spec, kind in keys.items():
        check_config_key(path, hf, spec, kind, model_type)


def config_value(hf: dict, name: str):
    """``hf[name]``, where ``name`` may be a nested ``a.b``; a ``KeyError`` when absent."""
    value = hf
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(name)
        value = value[part]
    return value


#: What each declared type means for a config.json value.
KINDS = {
    int: ("a positive integer", lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0),
    float: (
        "a positive number",
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0,
    ),
    bool: ("true or false", lambda v: isinstance(v, bool)),
}


def check_config_key(path: Path, hf: dict, spec: str, kind: type, model_type: str) -> None:
    """One key of ``spec`` ("a|b.c": any one of the alternatives) is present and of ``kind``."""
    names = spec.split("|")
    for name in names:
        try:
            value = config_value(hf, name)
        except KeyError:
            continue
        what, valid = KINDS[kind]
        if not valid(value):
            raise PreflightError(f"{path}: {name} is {value!r}, not {what}; {CONFIG_FIX}")
        return
    raise PreflightError(
        f"{path} has no {' or '.join(names)}, which a {model_type} model is built from (transformers would "
        f"silently use its own default, not this model's); {CONFIG_FIX}"
    )


# --- weights -------------------------------------------------------------------------------

#: The one index name torchtitan's state-dict adapter and transformers read.
INDEX_FILE = "model.safetensors.index.json"
#: What transformers loads from a directory without an index.
SINGLE_FILE = "model.safetensors"
WEIGHTS_FIX = "re-copy or re-download the model directory"


def read_safetensors_header(path: Path) -> dict[str, tuple[str, list[int]]]:
    """``{tensor: (dtype, shape)}`` through ``safetensors.safe_open``, which checks the header and the size.

    safe_open refuses a header that is too small, too large or not JSON, and a file shorter
    than its header says ("incomplete metadata, file not fully covered"): each becomes one line.
    """

    try:
        with safe_open(str(path), "pt") as f:
            slices = {key: f.get_slice(key) for key in f.keys()}
            return {key: (s.get_dtype(), s.get_shape()) for key, s in slices.items()}
    except SafetensorError as e:
        what = (
            "is truncated" if "not fully covered" in str(e) else "has a corrupt safetensors header"
        )
        raise PreflightError(f"{path} {what} ({one_line(e)}); {WEIGHTS_FIX}") from None
    except OSError as e:
        raise PreflightError(f"{path} cannot be read ({e.strerror}); {WEIGHTS_FIX}") from None


def check_weights(model_dir: Path) -> dict[str, dict]:
    """Every ``*.safetensors`` header, and the index's shards, as both loaders read them; returns the headers."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise PreflightError(
            f"--model-dir {model_dir} holds no *.safetensors weights; the recipes load only "
            "safetensors (never pickled .bin files)"
        )
    headers = {path.name: read_safetensors_header(path) for path in files}
    for name, header in headers.items():
        check_float_tensors(model_dir / name, header)
    index = model_dir / INDEX_FILE
    if index.exists():
        check_index(index, headers)
    elif SINGLE_FILE not in headers:
        raise PreflightError(
            f"--model-dir {model_dir} holds {', '.join(headers)} but neither {SINGLE_FILE} nor {INDEX_FILE}: "
            f"transformers (the host reference) loads only those; restore the {INDEX_FILE} that came with the shards"
        )
    return headers


#: The safetensors dtypes a recipe loads into its float parameters.
FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")


def check_float_tensors(path: Path, header: dict[str, tuple[str, list[int]]]) -> None:
    """Every tensor is floating point: an integer or quantized one would be cast into a float parameter
    and trained (seen: step-1 loss 30186 on int8 weights, "agreeing" with the reference)."""
    other = sorted(key for key, (dtype, _) in header.items() if dtype not in FLOAT_DTYPES)
    if other:
        raise PreflightError(
            f"{path}: tensor {other[0]!r} is {header[other[0]][0]}, not floating point ({', '.join(FLOAT_DTYPES)}; "
            f"{len(other)} such tensor(s): a quantized or foreign checkpoint); point --model-dir at the model's "
            "unquantized float weights"
        )


def check_index(index: Path, headers: dict[str, dict]) -> None:
    """``model.safetensors.index.json`` names shards that are there and hold what it says.

    torchtitan loads every ``*.safetensors`` of the directory and numbers the index's shards by
    the first digits of their names (``StateDictAdapter.__init__``: ``re.search(r"\\d+", ...)``);
    transformers loads the shards the index names. Both must see the same files.
    """
    fix = f"re-copy {INDEX_FILE} together with the shards it names ({WEIGHTS_FIX})"
    weight_map = read_json_object(index, fix).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise PreflightError(f"{index} has no weight_map object (tensor name -> shard file); {fix}")
    shards: dict[str, list[str]] = {}
    for key, shard in weight_map.items():
        shards.setdefault(str(shard), []).append(key)
    for shard, keys in sorted(shards.items()):
        if shard not in headers:
            raise PreflightError(
                f"{index} names shard {shard} ({len(keys)} tensor(s), e.g. {keys[0]!r}), which is not in "
                f"{index.parent}; copy the missing shard there ({WEIGHTS_FIX})"
            )
        if not re.search(r"\d+", shard):
            raise PreflightError(
                f"{index}: shard name {shard!r} holds no number, which torchtitan's checkpoint loader needs "
                "(it numbers shards by their names, e.g. model-00001-of-00002.safetensors); "
                "rename the shard and its index entries"
            )
        missing = [key for key in keys if key not in headers[shard]]
        if missing:
            raise PreflightError(
                f"{index} puts tensor {missing[0]!r} in {shard}, which does not hold it "
                f"({len(missing)} such tensor(s)); {fix}"
            )
    unnamed = sorted(set(headers) - set(shards))
    if unnamed:
        raise PreflightError(
            f"{index.parent / unnamed[0]} is not named by {INDEX_FILE}: torchtitan loads every *.safetensors "
            "file of --model-dir, transformers only the index's shards; move it out of the model directory"
        )


# --- tokenizer -----------------------------------------------------------------------------

TOKENIZER_FIX = (
    "copy the model's tokenizer.json and tokenizer_config.json there from the model's source"
)
#: Special-token keys torchtitan's HuggingFaceTokenizer reads from tokenizer_config.json
#: (torchtitan/components/tokenizer.py ``_infer_special_tokens``): a string, {"content": ...} or null.
SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "pad_token",
    "unk_token",
    "sep_token",
    "cls_token",
    "mask_token",
)


def check_tokenizer_dir(tokenizer_dir: Path) -> int:
    """The tokenizer files torchtitan's HuggingFaceTokenizer reads load; returns the vocab size."""
    if not tokenizer_dir.is_dir():
        state = "is a file, not a directory" if tokenizer_dir.exists() else "does not exist"
        raise PreflightError(
            f"tokenizer directory {tokenizer_dir} {state}; pass --tokenizer-dir DIR (default: --model-dir) "
            "holding tokenizer.json and tokenizer_config.json"
        )
    path = tokenizer_dir / "tokenizer.json"
    if not path.is_file():
        state = "is a directory, not a file" if path.exists() else "does not exist"
        raise PreflightError(
            f"{path} {state}: the run tokenizes with the tokenizer of --model-dir (or --tokenizer-dir); "
            f"{TOKENIZER_FIX}"
        )
    vocab_size = load_tokenizer(path).get_vocab_size()
    config = tokenizer_dir / "tokenizer_config.json"
    if config.exists():
        check_tokenizer_config(
            config, read_json_object(config, "re-copy it from the model's source, or delete it")
        )
    return vocab_size


def load_tokenizer(path: Path):
    """``tokenizers.Tokenizer.from_file(path)``, its refusal (a truncated or foreign file) on one line."""

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 -- tokenizers raises a bare Exception for every parse error
        raise PreflightError(
            f"{path} is not a tokenizer the tokenizers library can load ({one_line(e)}); re-copy tokenizer.json "
            "from the model's source"
        ) from None


def check_tokenizer_config(path: Path, config: dict) -> None:
    """Special tokens as torchtitan parses them; anything else raises mid-start on every rank."""
    fix = "re-copy tokenizer_config.json from the model's source"
    for key in SPECIAL_TOKEN_KEYS:
        token = config.get(key)
        valid = (
            token is None
            or isinstance(token, str)
            or isinstance(token, dict)
            and isinstance(token.get("content"), str)
        )
        if not valid:
            raise PreflightError(
                f'{path}: {key} is {token!r}, not a string or {{"content": "..."}}; {fix}'
            )
    decoder = config.get("added_tokens_decoder", {})
    if not isinstance(decoder, dict):
        raise PreflightError(
            f"{path}: added_tokens_decoder is a JSON {type(decoder).__name__}, not an object; {fix}"
        )
    for token_id, token in decoder.items():
        if isinstance(token, dict) and "content" in token and not str(token_id).isdigit():
            raise PreflightError(
                f"{path}: added_tokens_decoder key {token_id!r} is not a token id; {fix}"
            )


# --- data ----------------------------------------------------------------------------------

#: The fix every data refusal names.
JSONL_FIX = 'each line must be one JSON object with a non-empty "text" string, e.g. {"text": "..."}'
DATASET_FIX = (
    'point --dataset-dir at a directory of *.jsonl files with one {"text": ...} object per line'
)


def check_dataset_dir(data: Path | None) -> list[Path]:
    """The files ``datasets.load_dataset(data, split="train")`` reads, each record checked; returns them."""
    if data is None or not data.exists():
        raise PreflightError(f"--dataset-dir {data} does not exist; {DATASET_FIX}")
    if not data.is_dir():
        raise PreflightError(
            f"--dataset-dir {data} is a file, not a directory; {DATASET_FIX} (e.g. {data.parent})"
        )
    files = train_files(data)
    for path in files:
        check_jsonl_text(path)
    return files


def train_files(data: Path) -> list[Path]:
    """What torchtitan's loader reads: ``load_dataset(dir, split="train")`` (its ``c4_test`` entry).

    Asks ``datasets`` itself (``LocalDatasetModuleFactory``, the resolver ``load_dataset`` uses
    for a local directory): it reads the most common data-file extension only, and file names
    beginning with test/valid/eval name other splits.
    """
    from datasets.data_files import EmptyDatasetError  # noqa: PLC0415 -- heavy: datasets 2.0 s; this module stays light
    from datasets.load import LocalDatasetModuleFactory  # noqa: PLC0415 -- heavy: datasets 2.0 s; this module stays light

    try:
        module = LocalDatasetModuleFactory(str(data)).get_module()
    except EmptyDatasetError:
        raise PreflightError(
            f"--dataset-dir {data} holds no *.jsonl or *.json data files; "
            'put the corpus there as one {"text": ...} object per line'
        ) from None
    except Exception as e:  # noqa: BLE001 -- datasets' resolver raises many types; each is a refusal
        raise PreflightError(
            f"datasets cannot read --dataset-dir {data} ({one_line(e)}); {DATASET_FIX}"
        ) from None
    configs = module.builder_configs_parameters.builder_configs
    splits = configs[0].data_files or {}
    reader = module.module_path.rsplit(".", 1)[-1]
    read = sorted(Path(f).name for files in splits.values() for f in files)
    if reader != "json":
        raise PreflightError(
            f"datasets.load_dataset would read --dataset-dir {data} as {reader} files ({', '.join(read)}), "
            "the most common data-file extension there, and skip the *.jsonl; move those files out"
        )
    if "train" not in splits:
        raise PreflightError(
            f"datasets.load_dataset({data}, split='train') finds no train split: it reads {', '.join(read)} as "
            f"split {', '.join(map(str, splits))} (names beginning test/valid/eval name a split); "
            "rename the corpus file, e.g. to train.jsonl"
        )
    return [Path(f) for f in splits["train"]]


def count_records(data: Path, enough: int) -> int:
    """The non-blank lines of the files ``datasets`` reads from ``data``, counted up to ``enough`` (no JSON parse)."""
    records = 0
    for path in train_files(data):
        with path.open("rb") as f:
            for raw in f:
                records += bool(raw.strip())
                if records >= enough:
                    return records
    return records


def check_jsonl_text(path: Path) -> int:
    """Every record of a JSON-lines corpus file is an object with a non-empty "text" string.

    Streams the file once, one line in memory at a time, so a bad line anywhere is
    refused with its number before any rank starts (torchtitan's loader would fail in
    every rank, mid-run, with pyarrow's "Unexpected character ..."). Cost: one
    ``json.loads`` per line, about 0.3 s per 100 MB of c4-like text on one core.
    Blank lines are skipped, as the loader does. Returns the number of records.
    """
    records = 0
    try:
        with path.open("rb") as f:
            check_encoding(path, f.read(4))
            f.seek(0)
            for number, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                records += 1
                problem = jsonl_problem(raw)
                if problem:
                    raise PreflightError(f"{path}:{number}: {problem}; {JSONL_FIX}")
    except OSError as e:
        raise PreflightError(f"{path} cannot be read ({e.strerror}); {DATASET_FIX}") from None
    if not records:
        raise PreflightError(f"{path} holds no text (the file is empty); {JSONL_FIX}")
    return records


#: Byte-order marks an editor writes ("UTF-8 with BOM", "UTF-16"), longest first; datasets' JSON reader
#: (pyarrow) reads UTF-8 only and fails on each on every rank ("Expected object or value").
BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32 text", "utf-32"),
    (b"\x00\x00\xfe\xff", "UTF-32 text", "utf-32"),
    (b"\xef\xbb\xbf", "UTF-8 text with a byte-order mark", "utf-8-sig"),
    (b"\xff\xfe", "UTF-16 text", "utf-16"),
    (b"\xfe\xff", "UTF-16 text", "utf-16"),
)


def check_encoding(path: Path, head: bytes) -> None:
    """A corpus file is plain UTF-8: one an editor saved with a byte-order mark is refused, naming the re-save."""
    for bom, encoding, codec in BOMS:
        if head.startswith(bom):
            resave = f"p = pathlib.Path(sys.argv[1]); p.write_text(p.read_text('{codec}'), 'utf-8')"
            raise PreflightError(
                f"{path} is {encoding}, which the run's JSON reader (pyarrow) cannot read; save it as UTF-8 "
                f'without a byte-order mark (an editor\'s "UTF-8", not "UTF-8 with BOM" or "UTF-16"), e.g. '
                f'python3 -c "import pathlib, sys; {resave}" {path}'
            )


def jsonl_problem(raw: bytes) -> str | None:
    """What is wrong with one JSON-lines record, or None."""
    if b"\x00" in raw:
        return "NUL bytes: UTF-16 or UTF-32 text without a byte-order mark, or a binary file; save it as UTF-8"
    try:
        record = json.loads(raw)
    except UnicodeDecodeError as e:
        return f"not UTF-8 (byte {e.start} of the line: Latin-1 or another 8-bit encoding?); save the file as UTF-8"
    except json.JSONDecodeError as e:
        return f"not JSON ({e.msg} at column {e.colno})"
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    text = record.get("text")
    if not isinstance(text, str) or not text.strip():
        return 'no non-empty "text" string' + (
            "" if "text" in record else f" (keys: {', '.join(sorted(record)) or 'none'})"
        )
    return None
