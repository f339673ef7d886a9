"""Each harness option and the torchtitan option it sets: given both, they must agree.

``apply_run_options`` sets ``training.steps`` from ``--steps`` (and so on); torchtitan's own
parser then applies ``--training.steps`` on top, so a differing value would silently win.
Both given with different values is refused in one line naming both, as ``--export-dir`` with
``--no-export`` is.
"""

from __future__ import annotations

from pathlib import Path

from harness.options.paths import given
from recipes.errors import RecipeError


def _path(value: str) -> Path:
    return Path(value).expanduser().resolve()


#: (harness option, the torchtitan option it sets, how a value is read for comparing).
MAPPED = (
    ("--steps", "--training.steps", int),
    ("--seq-len", "--training.seq_len", int),
    ("--local-batch-size", "--training.local_batch_size", int),
    ("--seed", "--debug.seed", int),
    ("--dataset-dir", "--dataloader.dataset_path", _path),
    ("--tokenizer-dir", "--hf_assets_path", _path),
)


def check_one_value(argv: list[str], cli_overrides: list[str]) -> None:
    """Refuse a harness option and its torchtitan option given with different values."""
    for ours, theirs, read in MAPPED:
        mine, other = given(argv, (ours,)), given(cli_overrides, (theirs,))
        if not (mine and other):
            continue
        (flag, value), (titan_flag, titan_value) = mine[-1], other[-1]
        try:
            same = read(value) == read(titan_value)
        except (ValueError, OSError, RuntimeError):
            continue  # a value its own parser refuses, with its own line
        if not same:
            raise RecipeError(
                f"{flag} {value} and {titan_flag} {titan_value} set the same torchtitan option "
                f"({theirs[2:]}) to different values, and {titan_flag} would silently win; "
                f"give only one of them"
            )
