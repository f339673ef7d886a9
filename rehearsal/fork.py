"""The TorchTitan Neuron stand-in: a local git repository that `make neuron-venv` clones over file://.

The real fork (github.com/aws-neuron/torchtitan-neuron, not publicly readable from here) installs
the distribution ``torchtitan`` 0.2.2+neuron.1 and ships its recipes as
``torchtitan_neuron.models.qwen3.config_registry`` (aws-neuron/aws-neuron-sdk
training/torchtitan/get-started/setup-torchtitan-neuron.rst, release-notes/components/torchtitan-neuron.rst;
/work/shared/DESIGN.md "Packages and install"). The stand-in's distribution is that one too,
``torchtitan`` 0.2.2+neuron.1, so the night's version check (tests/neuron/test_versions_neuron.py) reads
what it reads on trn2. It holds only the package ``torchtitan_neuron``: ``import torchtitan`` still loads
the stock 0.3.0 of the cpu venv the stand-in venv is layered on (a .pth). pip installs the fork into
the suite's venv and leaves that torchtitan 0.3.0 alone: it never uninstalls a distribution outside the
environment it installs into ("Not uninstalling torchtitan at ..., outside environment ..."; tried on a
two-level layered venv in /tmp), and rehearsal/night.py's snapshot fails the rehearsal if the cpu venv's
distributions change. (Under the stand-in, ``importlib.metadata.version("torchtitan")`` says
0.2.2+neuron.1 while the code is 0.3.0's: the names check runs against stock torchtitan, not the fork.)

Its ``qwen3_nki_moe_config`` builds config 3 from stock torchtitan classes (``qwen3_30b_a3b``,
``_build_qwen3_moe_layers``, ``ScaledDotProductAttention``), never from the suite's twin in
recipes/nki_moe.py, so a suite that only agrees with itself shows here. Two classes are not stock: its RoPE
and its experts. The tutorial's article says the fork's function "replaces the MoE block with the NKI
grouped-experts implementation" and selects "SDPA and rotary embedding without gather"
(:data:`ARTICLE_CONFIG3`); the real classes are not public, so the stand-in takes the suite's
(``TrnGroupedExperts`` through ``--override grouped_experts``, so a rehearsal's config 3 launches run the MoE
kernel stand-ins; stock ``GroupedExperts`` fails the night's experts judge). Stock ``CosSinRoPE`` gathers its cache per position (the night's judge,
``recipes.kernels.rope_gathers``, found ``index`` in it). Which class the real fork builds is not public;
the stand-in takes the gather-free RoPE the suite's twin uses (``recipes.kernels.rope.SlicedCosSinRoPE``,
stock ``CosSinRoPE`` with positions dropped, so its cache is sliced): the one gather-free RoPE the suite's
``--override rope_hf`` replaces by exact class, as the night's config3-rope_hf lane needs. So in a
rehearsal the fork and the twin cannot differ in RoPE or experts class. The checkout holds
``tests/assets/c4_test`` (the fixture corpus) and ``tests/assets/tokenizer`` (harness/options/lanes.py TITAN_DATASET,
TITAN_TOKENIZER): a BPE that is not the weights', as torchtitan's test tokenizer is not Qwen3's
(:func:`test_tokenizer`).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REF = "release-2.33"
DISTRIBUTION = "torchtitan"
VERSION = "0.2.2+neuron.1"

PYPROJECT = f"""\
# Rehearsal stand-in for TorchTitan Neuron (rehearsal/fork.py): NOT the real fork.
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "{DISTRIBUTION}"
version = "{VERSION}"
description = "rehearsal stand-in: torchtitan_neuron recipes over stock torchtitan 0.3.0"
requires-python = ">=3.11"

[tool.setuptools.packages.find]
include = ["torchtitan_neuron*"]
"""

# The fork's own dependencies: the stand-in needs only the stock torchtitan 0.3.0 (and its dependencies) of the
# layered cpu venv, which a requirement could not name: ``torchtitan`` is this distribution's own name.
REQUIREMENTS = "# rehearsal stand-in: nothing beyond the layered cpu venv (torchtitan 0.3.0 and its dependencies)\n"

#: The tutorial article's sentence on config 3 (its paragraph on the third configuration, line 16 of the copy the
#: issues quote): "qwen3_nki_moe_config(...) replaces the MoE block with the NKI grouped-experts implementation,
#: and selects SDPA and rotary embedding without gather".
ARTICLE_CONFIG3 = "将MoE块替换为NKI分组专家实现，并选用SDPA和不带gather的旋转嵌入"

CONFIG_REGISTRY = '''\
"""Rehearsal stand-in of TorchTitan Neuron's qwen3 recipes: built from stock torchtitan 0.3.0 classes, but its
RoPE and its experts (rehearsal/fork.py says why)."""

from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.common.rope import CosSinRoPE
from torchtitan.models.qwen3 import _build_qwen3_moe_layers
from torchtitan.models.qwen3.config_registry import qwen3_30b_a3b

# Qwen3-30B-A3B's widths, as stock torchtitan's "30B-A3B" flavor has them.
_WIDTHS = dict(dim=2048, n_heads=32, n_kv_heads=4, head_dim=128, moe_hidden_dim=768)


def qwen3_nki_moe_config(flavor="30B-A3B", n_layers=4, num_experts=64, top_k=4):
    """The tutorial's config 3: 30B-A3B with n_layers layers, num_experts experts, top_k routing, SDPA, RoPE
    without gather, eager."""
    if flavor != "30B-A3B":
        raise ValueError(f"qwen3_nki_moe_config: flavor {flavor!r}; this stand-in builds 30B-A3B only")
    # The tutorial's article: the fork's function "selects SDPA and rotary embedding without gather"
    # ("选用SDPA和不带gather的旋转嵌入", its config 3 paragraph, line 16). Stock CosSinRoPE gathers its cache
    # per position; the real fork's class is not public, so the stand-in takes the suite's gather-free one
    # (stock CosSinRoPE with positions dropped: its cache sliced), imported here, when the function runs,
    # after the suite has set up torchtitan for the device.
    from recipes.kernels.rope import sliced_rope
    from recipes.overrides import apply_override_specs

    config = qwen3_30b_a3b()
    layers = _build_qwen3_moe_layers(
        n_layers=n_layers, num_experts=num_experts, top_k=top_k, attn_backend="flex",
        moe_comm_backend="standard",
        rope=sliced_rope(CosSinRoPE.Config(dim=_WIDTHS["head_dim"], max_seq_len=40960, theta=1000000.0)),
        **_WIDTHS,
    )
    for layer in layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    config.model_spec.model.layers = layers
    # The same sentence: the fork's function "replaces the MoE block with the NKI grouped-experts
    # implementation" (将MoE块替换为NKI分组专家实现). Its class is not public either: the stand-in takes the
    # suite's (TrnGroupedExperts, nkilib's moe_cte / blockwise_mm_bwd on the device), so a rehearsal's config 3
    # launches run the MoE kernel stand-ins as the twin's do.
    apply_override_specs(config, ["grouped_experts"])
    config.compile.enable = False
    config.parallelism.expert_parallel_degree = 1
    return config
'''


#: Ids of the stand-in's test tokenizer. torchtitan's tests/assets/tokenizer is a 2,020-id BPE, not the weights'
#: (harness/options/lanes.py TITAN_TOKENIZER; recipes/hf_as_published.py), and config 1's as-published lane tokenizes
#: with it: the stand-in's is likewise another BPE, with fewer ids than the tiny model's 1,024 embedding rows
#: as 2,020 is fewer than Qwen3's 151,936.
TEST_BPE_IDS = 512


def test_tokenizer(fixtures: Path, out: Path) -> None:
    """A byte-level BPE of :data:`TEST_BPE_IDS` ids trained on the fixture corpus: not the weights' tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: PLC0415 -- only the fork build trains a tokenizer

    from fixtures.build_fixtures import EOS_TOKEN, read_corpus, write_tokenizer  # noqa: PLC0415 -- heavy: fixtures.build_fixtures imports torch and transformers; only the build needs it

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TEST_BPE_IDS,
        special_tokens=[EOS_TOKEN],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(read_corpus(fixtures / "corpus"), trainer=trainer)
    write_tokenizer(tokenizer, out)


def git(*args: str, cwd: Path) -> str:
    env = {
        "GIT_AUTHOR_NAME": "rehearsal",
        "GIT_AUTHOR_EMAIL": "rehearsal@localhost",
        "GIT_COMMITTER_NAME": "rehearsal",
        "GIT_COMMITTER_EMAIL": "rehearsal@localhost",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
        "PATH": "/usr/bin:/bin",
        "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
    }
    out = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"rehearsal: git {' '.join(args)} in {cwd} failed: {out.stderr.strip()}")
    return out.stdout.strip()


def build(dest: Path, fixtures: Path) -> str:
    """The stand-in repository at ``dest`` with branch ``release-2.33``; returns its file:// URL."""
    dest.mkdir(parents=True)
    (dest / "pyproject.toml").write_text(PYPROJECT)
    (dest / "requirements.txt").write_text(REQUIREMENTS)
    package = dest / "torchtitan_neuron"
    for sub in ("", "models", "models/qwen3"):
        (package / sub).mkdir(parents=True, exist_ok=True)
        (package / sub / "__init__.py").write_text(
            '"""Rehearsal stand-in (rehearsal/fork.py)."""\n'
        )
    (package / "models/qwen3/config_registry.py").write_text(CONFIG_REGISTRY)
    assets = dest / "tests" / "assets"
    shutil.copytree(fixtures / "corpus", assets / "c4_test")
    test_tokenizer(fixtures, assets / "tokenizer")
    git("init", "--quiet", "--initial-branch", REF, cwd=dest)
    git("add", ".", cwd=dest)
    git("commit", "--quiet", "-m", "rehearsal stand-in of TorchTitan Neuron release-2.33", cwd=dest)
    return f"file://{dest}"
