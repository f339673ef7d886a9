"""A model directory's config.json, read once for the product and the checks: the one reader, light (no torch),
so the launcher's checks can read it before anything heavy is imported."""

from __future__ import annotations

import json
from pathlib import Path

from recipes.errors import RecipeError


def read_json_object(path: Path, fix: str, error: type[RecipeError] = RecipeError) -> dict:
    """``path`` parsed as one JSON object, or ``error`` in one line naming what it is instead and ``fix``."""
    if path.is_dir():
        raise error(f"{path} is a directory, not a JSON file; {fix}")
    try:
        data = json.loads(path.read_bytes())
    except OSError as e:
        raise error(f"{path} cannot be read ({e.strerror}); {fix}") from None
    except UnicodeDecodeError as e:
        raise error(f"{path} is not UTF-8 text (byte {e.start}); {fix}") from None
    except json.JSONDecodeError as e:
        raise error(
            f"{path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); {fix}"
        ) from None
    if not isinstance(data, dict):
        raise error(f"{path} holds a JSON {type(data).__name__}, not an object; {fix}")
    return data


CONFIG_FIX = "re-copy config.json from the model's source (e.g. Qwen/Qwen3-4B-Instruct-2507)"


def read_hf_config(model_dir: Path, error: type[RecipeError] = RecipeError) -> dict:
    """``model_dir``'s config.json as written: the one reader (the product's and the checks', which pass
    ``PreflightError``), refusing a missing or broken file in one line."""
    path = Path(model_dir) / "config.json"
    if not path.exists():
        raise error(
            f"--model-dir {model_dir} has no config.json; point --model-dir at a Hugging Face model "
            "directory (config.json, tokenizer.json, *.safetensors), e.g. a local copy of "
            "Qwen/Qwen3-4B-Instruct-2507"
        )
    return read_json_object(path, CONFIG_FIX, error)
