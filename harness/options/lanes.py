"""Lanes: the tutorial's config as published, and what the suite corrects, each a separately named run.

A published number is judged on the tutorial's config as the tutorial ran it; what the
suite corrects is another lane with its own name, judged against the host reference
(``harness.reference.diagnosis``), never against the published number. On trn2:

=================  ============================================================================
lane               what differs from the suite's recipe
=================  ============================================================================
as_published      the tutorial's inputs and upstream's behaviour. It ran from a TorchTitan
                   Neuron checkout, so torchtitan's defaults read that checkout's
                   ``tests/assets/c4_test`` (every config) and, for config 1, whose
                   ``transformers_modeling_backend_full()`` sets no ``hf_assets_path``,
                   ``tests/assets/tokenizer`` (the 2,020-id test BPE); config 1 keeps
                   upstream's RoPE init (``QWEN3_HF_KEEP_DEFECTS=inv_freq``: ``inv_freq`` left as
                   ``to_empty()`` memory under transformers 5.x, torchtitan issue 4783);
                   config 2 keeps ``model_registry("4B")``'s RoPE theta 1e6 (config.json: 5e6)
tokenizer_fixed    config 1 as published with the weights' own tokenizer (a diagnosis lane)
inv_freq_fixed     config 1 as published with ``inv_freq`` recomputed (a diagnosis lane)
corrected          the suite's recipe: the weights' own tokenizer, ``inv_freq`` recomputed,
                   config.json's theta; text from ``$QWEN3_DATASET_DIR``
=================  ============================================================================

Which lanes each recipe has is declared in its catalogue entry (``harness.declare.catalogue``).
Open question for config 2: ``qwen3_32b()`` sets ``hf_assets_path="./assets/hf/Qwen3-32B"``
(pytorch/torchtitan torchtitan/models/qwen3/config_registry.py); the tutorial must have pointed it
at the 4B weights' directory to load them, so its as-published lane reads the weights' own tokenizer.

Sources: ``Trainer.Config.hf_assets_path`` defaults to ``"./tests/assets/tokenizer"``
(torchtitan/trainer.py); ``HuggingFaceTextDataLoader``'s ``c4_test`` reads
``tests/assets/c4_test`` relative to the working directory
(torchtitan/hf_datasets/text_datasets.py, pytorch/torchtitan before 1b04fc1c3).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from harness.options.run_options import RunOptions

#: Inside a TorchTitan checkout: torchtitan's defaults, relative to where the tutorial ran.
TITAN_DATASET = Path("tests/assets/c4_test")
TITAN_TOKENIZER = Path("tests/assets/tokenizer")
#: How a command shows the checkout when this machine has none (a PyPI torchtitan).
CHECKOUT_PLACEHOLDER = "$TORCHTITAN_CHECKOUT"

KEEP_DEFECTS_ENV = "QWEN3_HF_KEEP_DEFECTS"


@dataclass(frozen=True)
class Lane:
    """One way of running a recipe: its name, why it exists, and the options and environment it sets."""

    name: str
    recipe: str
    description: str
    #: Read the checkout's tests/assets/c4_test (the tutorial's) instead of $QWEN3_DATASET_DIR.
    titan_dataset: bool = False
    #: Read the checkout's tests/assets/tokenizer (config 1 as published) instead of the weights' own.
    titan_tokenizer: bool = False
    #: Upstream defects kept (recipes.hf_as_published, via $QWEN3_HF_KEEP_DEFECTS).
    kept_defects: tuple[str, ...] = ()
    #: Deviations from the weights' config.json the lane accepts (--allow-mismatch).
    allow_mismatch: tuple[str, ...] = ()
    #: RoPE theta replacing the recipe's (the corrected config 2: config.json's 5e6).
    rope_theta: float | None = None
    #: Judges published numbers (only the as-published lane does).
    published: bool = False

    @property
    def key(self) -> str:
        return f"{self.recipe}.{self.name}"

    def options(self, checkout: Path | None = None, **run) -> RunOptions:
        """The run's options on trn2 (``run``: init, steps, seed, run_dir, ...); ``checkout`` for the titan assets."""
        titan = checkout or titan_checkout()[0] or Path(CHECKOUT_PLACEHOLDER)
        paths = {}
        if self.titan_dataset:
            paths["dataset_dir"] = titan / TITAN_DATASET
        if self.titan_tokenizer:
            paths["tokenizer_dir"] = titan / TITAN_TOKENIZER
        allow = list(self.allow_mismatch)
        if self.titan_tokenizer and run.get("init", "hf") == "hf":
            allow.append(
                "tokenizer"
            )  # the run's own refusal, accepted: it is what the tutorial ran
        if run.get("init") == "random":  # random init loads no config.json to disagree with
            allow = [a for a in allow if a != "rope_theta"]
        return RunOptions(
            recipe=self.recipe,
            tier="trn2",
            allow_mismatch=allow,
            rope_theta=self.rope_theta,
            **paths,
            **run,
        )

    def env(self) -> dict[str, str]:
        """What the launch's environment sets for every rank (the kept defects)."""
        return {KEEP_DEFECTS_ENV: ",".join(self.kept_defects)}


def titan_checkout() -> tuple[Path | None, str]:
    """The TorchTitan Neuron checkout ``make neuron-venv`` installed, or ``(None, why)``.

    Its install record (``<venv>/torchtitan-neuron.json``, recipes.platform.torchtitan_checkout) names the
    checkout; without one, an editable torchtitan's package sits in its checkout, so the package's parent
    directory is taken. Either way the checkout must hold torchtitan's ``tests/assets``.
    """

    from recipes.platform.torchtitan_checkout import checkout_info  # noqa: PLC0415 -- --help stays fast: recipes.platform (on python -m harness's import path)

    info = checkout_info()
    if info["installed"]:
        root, found_by = Path(info["checkout"]), f"the install record {info['record']}"
    else:
        spec = importlib.util.find_spec("torchtitan")
        if spec is None or not spec.origin:
            return None, "torchtitan is not installed"
        root, found_by = (
            Path(spec.origin).resolve().parents[1],
            "where `import torchtitan` loads from",
        )
    missing = [p for p in (TITAN_DATASET, TITAN_TOKENIZER) if not (root / p).is_dir()]
    if missing:
        return None, (
            f"torchtitan at {root} ({found_by}) is not a TorchTitan checkout ({', '.join(map(str, missing))} "
            "absent there): the as-published lanes read torchtitan's own test assets; install TorchTitan Neuron "
            "from its checkout (make neuron-venv clones it and installs it with pip install -e)"
        )
    return root, ""


@contextlib.contextmanager
def lane_env(lane_: Lane):
    """The lane's environment for one launch in this process (every rank inherits it); restored after."""
    before = {k: os.environ.get(k) for k in lane_.env()}
    os.environ.update({k: v for k, v in lane_.env().items() if v})
    for k, v in lane_.env().items():
        if not v:
            os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
