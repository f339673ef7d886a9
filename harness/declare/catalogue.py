"""The catalogue: everything the harness knows about each recipe, declared once, as data.

One :class:`Entry` per recipe of ``recipes.registry.RECIPES``: its lanes, its night launches
and what each serves, its published claims and the launch and test judging each, the launch
its trn2 band is made of, upstream's spec its model must match (the dry run), its 4B-width
random-init proxy (the cpu tier's main job, ``harness.judge.proxy.proxy_options``), and the few
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

from harness.declare.entry import (
    EVERY_NIGHT,
    LANE_STEPS,
    LANES,
    ON_CHANGE,
    ClaimJudge,
    Entry,
    Fork,
    Launch,
    Proxy,
    Upstream,
)
from harness.options.lanes import Lane

_HF = "tests/neuron/test_hf_backend_neuron.py"
_NATIVE = "tests/neuron/test_native_qwen3_neuron.py"
_REF = "tests/neuron/test_reference_neuron.py"
_CURVES = "tests/neuron/test_curves_neuron.py"
_MOE = "tests/neuron/test_nki_moe_neuron.py"
_KERNEL = "tests/neuron/test_rope_kernel_neuron.py"
_EXPORT_ON_CORRECTED = (
    "config 1 as published stops at a non-finite loss by step 2 (upstream's uninitialised inv_freq), before its "
    "export; corrected differs in the inv_freq buffer (non-persistent, in no checkpoint), the tokenizer and the "
    "text (token ids only: the embedding keeps the weights' 151,936 rows), none of which the exported keys read"
)

ENTRIES: dict[str, Entry] = {
    e.recipe: e
    for e in (
        Entry(
            recipe="hf_backend",
            tutorial="config 1",
            kind="dense",
            upstream=Upstream("4B"),
            lanes=(
                Lane(
                    "as_published",
                    "hf_backend",
                    "config 1 as the tutorial ran it: torchtitan's test tokenizer and "
                    "c4_test from the checkout, upstream's RoPE init (inv_freq left uninitialised)",
                    titan_dataset=True,
                    titan_tokenizer=True,
                    kept_defects=("inv_freq",),
                    published=True,
                ),
                Lane(
                    "tokenizer_fixed",
                    "hf_backend",
                    "config 1 as published with the weights' own tokenizer",
                    titan_dataset=True,
                    kept_defects=("inv_freq",),
                ),
                Lane(
                    "inv_freq_fixed",
                    "hf_backend",
                    "config 1 as published with inv_freq recomputed",
                    titan_dataset=True,
                    titan_tokenizer=True,
                ),
                Lane(
                    "corrected",
                    "hf_backend",
                    "the suite's recipe: the weights' own tokenizer, inv_freq recomputed, "
                    "$QWEN3_DATASET_DIR",
                ),
            ),
            # One step: upstream's uninitialised inv_freq makes step 2 NaN (DESIGN.md), step 1 sometimes, and torchtitan
            # stops at a non-finite loss before any export; steps past 1 serve nothing (the band is config1-corrected's).
            launches=(
                Launch(
                    "config1-as_published",
                    "hf_backend.as_published",
                    "hf",
                    1,
                    ("step1_loss_hf 6.54", "reference + diagnosis"),
                    (_HF, _REF),
                    reference=True,
                    suspects=2,
                    family="4B hf backend",
                ),
                Launch(
                    "config1-as_published-random",
                    "hf_backend.as_published",
                    "random",
                    1,
                    ("step1_loss_random 12.43",),
                    (_HF,),
                    family="4B hf backend",
                ),
                Launch(
                    "config1-corrected",
                    "hf_backend.corrected",
                    "hf",
                    LANE_STEPS,
                    ("reference (judged)", "band", "export round trip"),
                    (_REF, _CURVES, _HF),
                    export=True,
                    reference=True,
                    family="4B hf backend",
                ),
                # Diagnosis: on a stable night neither launches (harness.night.standing); the night puts them last.
                Launch(
                    "config1-tokenizer_fixed",
                    "hf_backend.tokenizer_fixed",
                    "hf",
                    1,
                    ("diagnosis: the tokenizer",),
                    (_REF,),
                    reference=True,
                    suspects=1,
                    when=ON_CHANGE,
                    explains="config1-as_published",
                    family="4B hf backend",
                ),
                Launch(
                    "config1-inv_freq_fixed",
                    "hf_backend.inv_freq_fixed",
                    "hf",
                    1,
                    ("diagnosis: inv_freq",),
                    (_REF,),
                    reference=True,
                    suspects=1,
                    when=ON_CHANGE,
                    explains="config1-as_published",
                    family="4B hf backend",
                ),
            ),
            claims=(
                ClaimJudge(
                    "hf_backend.trn2.step1_loss_hf",
                    "config1-as_published",
                    f"{_HF}::test_published_step1_loss_from_pretrained_weights",
                ),
                ClaimJudge(
                    "hf_backend.trn2.step1_loss_random",
                    "config1-as_published-random",
                    f"{_HF}::test_published_step1_loss_from_random_init",
                ),
                ClaimJudge(
                    "hf_backend.trn2.export_missing_keys",
                    "config1-corrected",
                    f"{_HF}::test_export_round_trip",
                    not_as_published=_EXPORT_ON_CORRECTED,
                ),
                ClaimJudge(
                    "hf_backend.trn2.export_unexpected_keys",
                    "config1-corrected",
                    f"{_HF}::test_export_round_trip",
                    not_as_published=_EXPORT_ON_CORRECTED,
                ),
            ),
            band_launch="config1-corrected",
            proxy=Proxy(fixture_config=True),
            bf16_experts=True,
        ),
        Entry(
            recipe="native_qwen3",
            tutorial="config 2",
            kind="dense",
            upstream=Upstream("4B"),
            lanes=(
                Lane(
                    "as_published",
                    "native_qwen3",
                    'config 2 as the tutorial ran it: model_registry("4B")\'s RoPE '
                    "theta 1e6 (config.json says 5e6), c4_test from the checkout",
                    titan_dataset=True,
                    allow_mismatch=("rope_theta",),
                    published=True,
                ),
                Lane(
                    "corrected",
                    "native_qwen3",
                    "config 2 with config.json's RoPE theta 5e6, $QWEN3_DATASET_DIR",
                    rope_theta=5e6,
                ),
            ),
            launches=(
                Launch(
                    "config2-as_published",
                    "native_qwen3.as_published",
                    "hf",
                    LANE_STEPS,
                    ("step1_loss_hf 6.54", "export round trip", "band", "reference + diagnosis"),
                    (_NATIVE, _REF, _CURVES),
                    export=True,
                    reference=True,
                    suspects=1,
                    family="4B native",
                ),
                Launch(
                    "config2-as_published-random",
                    "native_qwen3.as_published",
                    "random",
                    1,
                    ("step1_loss_random 12.43",),
                    (_NATIVE,),
                    family="4B native",
                ),
                Launch(
                    "config2-corrected",
                    "native_qwen3.corrected",
                    "hf",
                    1,
                    ("reference (judged)",),
                    (_REF,),
                    reference=True,
                    family="4B native",
                ),
                Launch(
                    "config2-torchtitan-train",
                    "native_qwen3.as_published",
                    "hf",
                    1,
                    ("torchtitan's own entry gives the harness's step 1",),
                    (_NATIVE,),
                    entry="torchtitan.train",
                    when=ON_CHANGE,
                    family="4B native",
                ),  # the harness's launch vs torchtitan's: moves with code
            ),
            claims=(
                ClaimJudge(
                    "native_qwen3.trn2.step1_loss_hf",
                    "config2-as_published",
                    f"{_NATIVE}::test_published_step1_loss_from_pretrained_weights",
                ),
                ClaimJudge(
                    "native_qwen3.trn2.step1_loss_random",
                    "config2-as_published-random",
                    f"{_NATIVE}::test_published_step1_loss_from_random_init",
                ),
                ClaimJudge(
                    "native_qwen3.trn2.export_missing_keys",
                    "config2-as_published",
                    f"{_NATIVE}::test_export_round_trip_keys",
                ),
                ClaimJudge(
                    "native_qwen3.trn2.export_unexpected_keys",
                    "config2-as_published",
                    f"{_NATIVE}::test_export_round_trip_keys",
                ),
            ),
            band_launch="config2-as_published",
            proxy=Proxy(),
            localized=True,
        ),
        Entry(
            recipe="nki_moe",
            tutorial="config 3",
            kind="moe",
            upstream=Upstream("30B-A3B", n_layers=4, num_experts=64, top_k=4),
            lanes=(
                Lane(
                    "as_published",
                    "nki_moe",
                    "config 3 as the tutorial builds it (the fork's qwen3_nki_moe_config "
                    "when importable), c4_test from the checkout",
                    titan_dataset=True,
                    published=True,
                ),
            ),
            launches=(
                Launch(
                    "config3-as_published",
                    "nki_moe.as_published",
                    "random",
                    LANE_STEPS,
                    ("trains", "band"),
                    (_MOE, _CURVES),
                    family="MoE",
                ),
                Launch(
                    "config3-rope_hf",
                    "nki_moe.as_published",
                    "random",
                    LANE_STEPS,
                    ("trains with rope_hf",),
                    (_MOE,),
                    overrides=("rope_hf",),
                    seq_len=2048,
                    family="MoE",
                ),
            ),
            claims=(
                ClaimJudge(
                    "nki_moe.trn2.rope_q_max_abs_diff",
                    None,
                    _KERNEL,
                    "one NeuronCore, float32, no launch",
                ),
                ClaimJudge(
                    "nki_moe.trn2.rope_k_max_abs_diff",
                    None,
                    _KERNEL,
                    "one NeuronCore, float32, no launch",
                ),
            ),
            band_launch="config3-as_published",
            proxy=None,
            band_init="random",
            fork=Fork("qwen3_nki_moe_config", "config 3"),
        ),
    )
}

# --- derived views, refilled in place from ENTRIES (so every importer sees an added entry) -----------

#: The trn2 night's 64-rank launches, in its order: every entry's every-night launches, then the on-change
#: ones (on a stable night none of those launches, so they never delay a verdict).
LAUNCHES: dict[str, Launch] = {}
#: Every published trn2 claim's judge, by claim (``<recipe>.trn2.<key>``).
CLAIM_JUDGES: dict[str, ClaimJudge] = {}
#: The lane run each recipe's trn2 band is made of and judged on (harness.judge.band.band_options).
BAND_LAUNCH: dict[str, str] = {}
#: What each recipe's trn2 model is, in upstream's terms.
UPSTREAM: dict[str, Upstream] = {}


def _derive() -> None:
    entries = ENTRIES.values()
    for view, value in (
        (LANES, {x.key: x for e in entries for x in e.lanes}),
        (
            LAUNCHES,
            {
                x.name: x
                for when in (EVERY_NIGHT, ON_CHANGE)
                for e in entries
                for x in e.launches
                if x.when == when
            },
        ),
        (CLAIM_JUDGES, {j.claim: j for e in entries for j in e.claims}),
        (BAND_LAUNCH, {e.recipe: e.band_launch for e in entries}),
        (UPSTREAM, {e.recipe: e.upstream for e in entries}),
    ):
        view.clear()
        view.update(value)


_derive()


def entry(recipe: str) -> Entry:
    if recipe not in ENTRIES:
        raise KeyError(f"recipe {recipe!r} has no entry in harness/declare/catalogue.py (ENTRIES)")
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
        return [
            "an Entry in harness/declare/catalogue.py ENTRIES (every part: lanes, launches, claims, upstream, proxy, band)"
        ]
    e, found = ENTRIES[recipe], []
    if not e.lanes:
        found.append("lanes")
    if any(x.recipe != recipe for x in e.lanes):
        found.append(
            f"lanes of its own (some name {sorted({x.recipe for x in e.lanes} - {recipe})})"
        )
    if sum(x.published for x in e.lanes) != 1:
        found.append("exactly one published (as-published) lane")
    if e.kind not in ("dense", "moe"):
        found.append(f"a kind of 'dense' or 'moe' (not {e.kind!r})")
    return found + _missing_launches(e) + _missing_judges(e)


def _missing_launches(e: Entry) -> list[str]:
    if not e.launches:
        return ["launches"]
    found, lanes = [], {x.key for x in e.lanes}
    stray = [x.name for x in e.launches if x.lane not in lanes]
    if stray:
        found.append(f"launches on its own lanes (not {stray})")
    idle = [x.key for x in e.lanes if x.key not in {launch.lane for launch in e.launches}]
    if idle:
        found.append(f"a launch of each lane (none for {idle})")
    if e.band_launch not in {x.name for x in e.launches}:
        found.append(f"a band launch among its launches (not {e.band_launch!r})")
    others = {x.name for o in ENTRIES.values() if o.recipe != e.recipe for x in o.launches}
    shared = sorted(others & {x.name for x in e.launches})
    if shared:
        found.append(f"launch names no other recipe uses (not {shared})")
    return found


def _missing_judges(e: Entry) -> list[str]:
    from harness.declare.published import CLAIMS  # noqa: PLC0415 -- --help stays fast: harness.declare.published (on python -m harness's import path)

    found = []
    if not e.claims:
        found.append("a judge of each published trn2 claim it must reproduce (none declared)")
    unknown = [
        j.claim for j in e.claims if j.claim.split(".")[-1] not in CLAIMS or j.claim.count(".") != 2
    ]
    if unknown:
        found.append(
            f"judges of claims named <recipe>.<tier>.<key of harness.declare.published.CLAIMS> (not {unknown})"
        )
    launches = {x.name for x in e.launches}
    stray = [j.claim for j in e.claims if j.launch is not None and j.launch not in launches]
    if stray:
        found.append(f"judges on its own launches (not for {stray})")
    foreign = [j.claim for j in e.claims if not j.claim.startswith(f"{e.recipe}.")]
    if foreign:
        found.append(f"judges of its own claims (not {foreign})")
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
