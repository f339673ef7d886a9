"""The catalogue: everything the harness knows about each recipe, declared once, as data.

One :class:`Entry` per recipe of ``recipes.registry.RECIPES``: its lanes, its night launches
and what each serves, its published claims and the launch and test judging each, the launch
its trn2 band is made of, upstream's spec its model must match (the dry run), its 4B-width
random-init proxy (the cpu tier's main job, ``harness.step1_forward.proxy_options``), and the few
facts of behaviour the harness branches on (``kind``, ``bf16_experts``, ``localized``,
``fork``). Lanes, the night's plan, the band, the dry run, provenance, the checks and the
reference read these entries; no other harness module names a recipe.

Adding a recipe: its module and ``RECIPES`` entry (recipes/), one :class:`Entry` here, its
goldens (``fixtures/goldens/<recipe>/``) and its tests. :func:`missing` says what an entry
lacks; tests/cpu/test_catalogue.py fails on any registered recipe it names.

Config 3 (``nki_moe``) has one lane: the fork's own ``qwen3_nki_moe_config`` when importable
(``recipes.nki_moe``), on the checkout's c4_test. Its tokenizer stays the Qwen3 one from
``$QWEN3_4B_DIR``: which ``hf_assets_path`` the fork's config 3 sets is an open question
(the fork is not public; the tutorial does not say).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from harness.lanes import Lane


@dataclass(frozen=True)
class Upstream:
    """Upstream's own spec a recipe's model must match, shrunk as the tutorial shrinks it (the dry run)."""

    flavor: str
    n_layers: int | None = None
    num_experts: int | None = None
    top_k: int | None = None


@dataclass(frozen=True)
class Proxy:
    """The recipe's 4B-width random-init stand-in on the cpu tier (``harness.verdicts.FULL_WIDTH_RANDOM_INIT``)."""

    #: Build the real Qwen3-4B-Instruct-2507 config.json in fixtures/ (no weights) and read the cpu tier's
    #: tokenizer: a recipe that builds whatever config.json it is pointed at.
    fixture_config: bool = False


@dataclass(frozen=True)
class Fork:
    """The fork's own config function the recipe's twin stands in for (``harness.config3_fork``).

    The recipe's module has ``config_source(tier)``, ``fork_config()`` and ``twin_config(tier, as_published)``.
    """

    #: The function's name in ``recipes.titan.BY_NAME``.
    name: str
    #: How the dry run names it ("config 3").
    label: str


@dataclass(frozen=True)
class Entry:
    """One recipe, as the harness knows it. Every field without a default must be declared."""

    recipe: str
    #: The tutorial's name for it ("config 1").
    tutorial: str
    #: "dense" or "moe": which step time the night's estimate uses (``harness.nightly.STEP_S``).
    kind: str
    upstream: Upstream
    lanes: tuple[Lane, ...]
    #: None: no 4B-width proxy (the recipe has no random init at that width).
    proxy: Proxy | None
    #: The band's init on tiers other than trn2 (trn2's band is a night launch's).
    band_init: str = "hf"
    #: Its MoE experts compute in bf16 by design: the reference's wider tolerance (MOE_BF16_EXPERTS) applies.
    bf16_experts: bool = False
    #: Its modules are mapped to transformers' (``harness.reference.localize``).
    localized: bool = False
    fork: Fork | None = None

    def lane(self, name: str) -> Lane:
        return next(x for x in self.lanes if x.name == name)

    @property
    def published_lane(self) -> Lane:
        """The lane that judges published numbers: the tutorial's config as published."""
        return next(x for x in self.lanes if x.published)

    @property
    def keeps_defects(self) -> bool:
        """A lane of it keeps upstream defects ($QWEN3_HF_KEEP_DEFECTS): provenance records which."""
        return any(x.kept_defects for x in self.lanes)


ENTRIES: dict[str, Entry] = {
    e.recipe: e
    for e in (
        Entry(
            "hf_backend", "config 1", "dense", Upstream("4B"),
            lanes=(
                Lane("as_published", "hf_backend", "config 1 as the tutorial ran it: torchtitan's test tokenizer and "
                     "c4_test from the checkout, upstream's RoPE init (inv_freq left uninitialised)",
                     titan_dataset=True, titan_tokenizer=True, kept_defects=("inv_freq",), published=True),
                Lane("tokenizer_fixed", "hf_backend", "config 1 as published with the weights' own tokenizer",
                     titan_dataset=True, kept_defects=("inv_freq",)),
                Lane("inv_freq_fixed", "hf_backend", "config 1 as published with inv_freq recomputed",
                     titan_dataset=True, titan_tokenizer=True),
                Lane("corrected", "hf_backend", "the suite's recipe: the weights' own tokenizer, inv_freq recomputed, "
                     "$QWEN3_DATASET_DIR"),
            ),
            proxy=Proxy(fixture_config=True), bf16_experts=True,
        ),
        Entry(
            "native_qwen3", "config 2", "dense", Upstream("4B"),
            lanes=(
                Lane("as_published", "native_qwen3", 'config 2 as the tutorial ran it: model_registry("4B")\'s RoPE '
                     "theta 1e6 (config.json says 5e6), c4_test from the checkout",
                     titan_dataset=True, allow_mismatch=("rope_theta",), published=True),
                Lane("corrected", "native_qwen3", "config 2 with config.json's RoPE theta 5e6, $QWEN3_DATASET_DIR",
                     rope_theta=5e6),
            ),
            proxy=Proxy(), localized=True,
        ),
        Entry(
            "nki_moe", "config 3", "moe", Upstream("30B-A3B", n_layers=4, num_experts=64, top_k=4),
            lanes=(
                Lane("as_published", "nki_moe", "config 3 as the tutorial builds it (the fork's qwen3_nki_moe_config "
                     "when importable), c4_test from the checkout", titan_dataset=True, published=True),
            ),
            proxy=None, band_init="random", fork=Fork("qwen3_nki_moe_config", "config 3"),
        ),
    )
}  # fmt: skip

# --- derived views, refilled in place from ENTRIES (so every importer sees an added entry) -----------

#: Every lane, by ``recipe.lane``.
LANES: dict[str, Lane] = {}
#: What each recipe's trn2 model is, in upstream's terms.
UPSTREAM: dict[str, Upstream] = {}


def _derive() -> None:
    LANES.clear()
    LANES.update({x.key: x for e in ENTRIES.values() for x in e.lanes})
    UPSTREAM.clear()
    UPSTREAM.update({e.recipe: e.upstream for e in ENTRIES.values()})


_derive()


def entry(recipe: str) -> Entry:
    if recipe not in ENTRIES:
        raise KeyError(f"recipe {recipe!r} has no entry in harness/catalogue.py (ENTRIES)")
    return ENTRIES[recipe]


def lane(recipe: str, name: str) -> Lane:
    return LANES[f"{recipe}.{name}"]


def with_proxy() -> list[str]:
    """Recipes whose random-init step-1 loss the cpu tier measures at the real 4B width."""
    return [e.recipe for e in ENTRIES.values() if e.proxy is not None]


def localized() -> str:
    """The recipe whose modules ``harness.reference.localize`` maps to transformers' (the first declared)."""
    return next(e.recipe for e in ENTRIES.values() if e.localized)


def forked() -> Entry | None:
    """The recipe whose tutorial config is the fork's own function (the dry run compares it with its twin)."""
    return next((e for e in ENTRIES.values() if e.fork is not None), None)


def missing(recipe: str) -> list[str]:
    """What ``recipe``'s entry lacks, one phrase each ([] when complete)."""
    if recipe not in ENTRIES:
        return [f"an Entry in harness/catalogue.py ENTRIES (every part: lanes, launches, claims, upstream, proxy, band)"]
    e, found = ENTRIES[recipe], []
    if not e.lanes:
        found.append("lanes")
    if any(x.recipe != recipe for x in e.lanes):
        found.append(f"lanes of its own (some name {sorted({x.recipe for x in e.lanes} - {recipe})})")
    if sum(x.published for x in e.lanes) != 1:
        found.append("exactly one published (as-published) lane")
    if e.kind not in ("dense", "moe"):
        found.append(f"a kind of 'dense' or 'moe' (not {e.kind!r})")
    return found


@contextlib.contextmanager
def added(*entries: Entry):
    """``entries`` in the catalogue for a while (a test's extra recipe); the derived views follow."""
    before = dict(ENTRIES)
    ENTRIES.update({e.recipe: e for e in entries})
    _derive()
    try:
        yield
    finally:
        ENTRIES.clear()
        ENTRIES.update(before)
        _derive()
