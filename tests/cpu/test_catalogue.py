"""The catalogue (harness/declare/catalogue.py): a recipe declares itself once, and the harness follows (issue 36 point 1).

Every registered recipe has a complete entry, no other harness module names a recipe, and a fourth
recipe declared only in recipes/, the goldens and the catalogue's entries (added here, in the test) is
picked up by the night's plan and dry run, the band, the lanes and the checks.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest

from harness.declare import catalogue
from harness.judge import gate, goldens
from harness.night import plan as nightly
from recipes.registry import RECIPES, Recipe
from recipes.tiers import REPO_ROOT

HARNESS = REPO_ROOT / "harness"


def test_every_registered_recipe_has_a_complete_entry_and_every_entry_a_recipe():
    assert list(catalogue.ENTRIES) and set(catalogue.ENTRIES) == set(RECIPES)
    for name in RECIPES:
        assert catalogue.missing(name) == [], name


def test_missing_names_each_part_a_recipe_lacks(monkeypatch):
    """Seen to fail: each broken entry below is named by the part it lacks."""
    monkeypatch.setitem(
        RECIPES,
        "qwen3_unlisted",
        Recipe("qwen3_unlisted", "recipes.native_qwen3", "native_qwen3", ""),
    )
    assert catalogue.missing("qwen3_unlisted") == [
        "an Entry in harness/declare/catalogue.py ENTRIES (every part: lanes, launches, claims, upstream, proxy, band)"
    ]
    native = catalogue.ENTRIES["native_qwen3"]
    broken = {
        "lanes": dataclasses.replace(native, lanes=()),
        "exactly one published (as-published) lane": dataclasses.replace(
            native, lanes=tuple(dataclasses.replace(x, published=True) for x in native.lanes)
        ),
        "a kind of 'dense' or 'moe' (not 'sparse')": dataclasses.replace(native, kind="sparse"),
        "lanes of its own (some name ['hf_backend'])": dataclasses.replace(
            native, lanes=native.lanes + catalogue.ENTRIES["hf_backend"].lanes[-1:]
        ),
        "launches": dataclasses.replace(native, launches=(), band_launch=""),
        "a band launch among its launches (not 'config1-corrected')": dataclasses.replace(
            native, band_launch="config1-corrected"
        ),
        "a judge of each published trn2 claim it must reproduce (none declared)": dataclasses.replace(
            native, claims=()
        ),
        "judges of claims named <recipe>.<tier>.<key of harness.declare.published.CLAIMS> "
        "(not ['native_qwen3.trn2.step1_loss_typo'])": dataclasses.replace(
            native,
            claims=native.claims[:1]
            + (dataclasses.replace(native.claims[0], claim="native_qwen3.trn2.step1_loss_typo"),),
        ),
    }
    for part, entry in broken.items():
        with catalogue.added(entry):
            assert part in catalogue.missing("native_qwen3"), (
                part,
                catalogue.missing("native_qwen3"),
            )
    assert catalogue.missing("native_qwen3") == []


def test_a_claim_dropped_from_the_declaration_or_its_goldens_file_fails_the_gate_by_name(tmp_path):
    """The claims a night must judge are declared in code; the goldens files must agree with them, both ways."""
    import shutil

    from harness.judge import gate, goldens

    native = catalogue.ENTRIES["native_qwen3"]
    assert gate.disagreements("trn2") == []
    dropped = dataclasses.replace(
        native, claims=tuple(j for j in native.claims if not j.claim.endswith("step1_loss_hf"))
    )
    with catalogue.added(dropped):
        assert gate.disagreements("trn2") == [
            f"{goldens.GOLDENS_DIR}/native_qwen3/trn2.json: published golden native_qwen3.trn2.step1_loss_hf "
            "has no judge declared in harness/declare/catalogue.py"
        ]
    copy = tmp_path / "goldens"
    shutil.copytree(goldens.GOLDENS_DIR, copy)
    (copy / "nki_moe" / "trn2.json").unlink()
    lines = gate.disagreements("trn2", copy)
    assert [line.split(": ")[0] for line in lines] == [str(copy / "nki_moe" / "trn2.json")] * 3, (
        lines
    )
    assert (
        "nki_moe.trn2.rope_q_max_abs_diff" in lines[1]
        and "nki_moe.trn2.rope_k_max_abs_diff" in lines[2]
    )


def recipe_names(text: str) -> list[str]:
    return [name for name in RECIPES if re.search(rf"{name}", text)]


def test_no_other_harness_module_names_a_recipe():
    """``grep -rn 'hf_backend|native_qwen3|nki_moe' harness/`` finds harness/declare/catalogue.py only (its docs too)."""
    found = {
        str(path.relative_to(REPO_ROOT)): recipe_names(path.read_text())
        for path in sorted(HARNESS.rglob("*.py"))
        if path != HARNESS / "declare" / "catalogue.py"
    }
    assert {path: names for path, names in found.items() if names} == {}
    assert recipe_names((HARNESS / "declare" / "catalogue.py").read_text()) == list(RECIPES)


# --- a fourth recipe, declared only where a recipe is declared ---------------------------------------

VARIANT = "qwen3_variant"


def variant_entry() -> catalogue.Entry:
    """A Qwen3 variant reusing config 2's module and the 4B fixture: two lanes, two launches, two claims."""
    lane = catalogue.Lane
    return catalogue.Entry(
        recipe=VARIANT,
        tutorial="config 2 variant",
        kind="dense",
        upstream=catalogue.Upstream("4B"),
        lanes=(
            lane(
                "as_published",
                VARIANT,
                "the variant as published",
                titan_dataset=True,
                allow_mismatch=("rope_theta",),
                published=True,
            ),
            lane("corrected", VARIANT, "the variant with config.json's theta", rope_theta=5e6),
        ),
        launches=(
            catalogue.Launch(
                "variant-as_published",
                f"{VARIANT}.as_published",
                "hf",
                catalogue.LANE_STEPS,
                ("step1_loss_hf 6.54", "band"),
                ("tests/neuron/test_variant_neuron.py",),
                family="4B variant",
            ),
            catalogue.Launch(
                "variant-corrected",
                f"{VARIANT}.corrected",
                "hf",
                1,
                ("reference (judged)",),
                ("tests/neuron/test_variant_neuron.py",),
                family="4B variant",
            ),
        ),
        claims=(
            catalogue.ClaimJudge(
                f"{VARIANT}.trn2.step1_loss_hf",
                "variant-as_published",
                "tests/neuron/test_variant_neuron.py::test_step1",
            ),
        ),
        band_launch="variant-as_published",
        proxy=catalogue.Proxy(),
    )


@pytest.fixture
def fourth_recipe(tmp_path, monkeypatch):
    """The variant's registry entry, its goldens file (one published claim) and its catalogue entry: nothing
    written under harness/."""
    monkeypatch.setitem(
        RECIPES, VARIANT, Recipe(VARIANT, "recipes.native_qwen3", "native_qwen3", "a Qwen3 variant")
    )
    goldens_dir = tmp_path / "goldens"
    shutil.copytree(goldens.GOLDENS_DIR, goldens_dir)
    native = json.loads((goldens_dir / "native_qwen3" / "trn2.json").read_text())
    (goldens_dir / VARIANT).mkdir()
    (goldens_dir / VARIANT / "trn2.json").write_text(
        json.dumps({"values": {"step1_loss_hf": native["values"]["step1_loss_hf"]}})
    )
    monkeypatch.setattr(goldens, "GOLDENS_DIR", goldens_dir)
    before = len(nightly.LAUNCHES)
    with catalogue.added(variant_entry()):
        yield before


def test_a_fourth_recipe_is_picked_up_by_lanes_plan_band_and_checks(fourth_recipe):
    assert catalogue.missing(VARIANT) == []
    assert catalogue.lane(VARIANT, "as_published").published
    # The night's plan: its launches are in it, and the count follows from the entries.
    assert (
        len(nightly.LAUNCHES)
        == fourth_recipe + 2
        == sum(len(e.launches) for e in catalogue.ENTRIES.values())
    )
    planned = [s.launch for s in nightly.steps() if s.launch]
    assert {"variant-as_published", "variant-corrected"} <= set(planned)
    assert sum(s.launches for s in nightly.steps()) == len(planned)
    text = "\n".join(nightly.claim_lines())
    assert (
        f"| {VARIANT}.trn2.step1_loss_hf | 6.54 | variant-as_published ({VARIANT}/as_published"
        in text
    )
    # The band: its trn2 band is its band launch's run; elsewhere, its band init and as-published acceptance.
    from harness.judge.band import band_options

    trn2 = band_options(VARIANT, "trn2")
    assert (trn2.recipe, trn2.init, trn2.steps, trn2.export) == (VARIANT, "hf", 20, False)
    assert trn2.allow_mismatch == nightly.LAUNCHES["variant-as_published"].options().allow_mismatch
    cpu = band_options(VARIANT, "cpu")
    assert (cpu.recipe, cpu.init, cpu.allow_mismatch) == (VARIANT, "hf", ["rope_theta"])
    # The checks and the 4B-width proxy.
    from harness.checks.preflight import OPTION_CHECKS
    from harness.judge.proxy import proxy_options

    for check in OPTION_CHECKS:
        check(trn2)
    assert VARIANT in catalogue.with_proxy()
    assert proxy_options(VARIANT, 0, REPO_ROOT / "unused").recipe == VARIANT


def test_a_fourth_recipe_is_dry_run_against_its_upstream(fourth_recipe, tmp_path):
    """The dry run builds the variant's 4B model on meta and compares it with its declared upstream."""
    from harness.night import dry_run
    from harness.options.run_options import RunOptions

    plan = dry_run.plan_run(
        RunOptions(recipe=VARIANT, tier="trn2", init="random", run_dir=tmp_path / "run")
    )
    result = dry_run.dry_run(plan, [])
    assert result["ok"], result["error"]
    upstream = result["model"]["upstream"]
    assert (upstream["spec"], upstream["same_parameters"]) == ('model_registry("4B")', True)


def test_a_fourth_recipes_claims_are_gated_and_its_goldens_held_to_them(
    fourth_recipe, tmp_path, capsys
):
    """require-claims asks the variant's declared claim of a night; a forgotten goldens file fails by name."""
    from harness.declare.claims import published_claims
    from harness.night import ci

    names = [c.name for c in published_claims("trn2")]
    assert f"{VARIANT}.trn2.step1_loss_hf" in names
    assert gate.disagreements("trn2") == []

    def report(claims: list[str]) -> Path:
        path = tmp_path / "tests.json"
        tests = [
            {"test": f"t::{n}", "outcome": "passed", "properties": {f"{n}.verdict": "pass"}}
            for n in claims
        ]
        path.write_text(json.dumps({"tests": tests}))
        return path

    assert ci.require_claims(report(names), "trn2") == 0
    assert ci.require_claims(report([n for n in names if not n.startswith(VARIANT)]), "trn2") == 1
    assert f"NOT MEASURED  {VARIANT}.trn2.step1_loss_hf (published 6.54)" in capsys.readouterr().err
    (goldens.GOLDENS_DIR / VARIANT / "trn2.json").unlink()
    assert ci.require_claims(report(names), "trn2") == 1
    err = capsys.readouterr().err
    assert (
        f"{goldens.GOLDENS_DIR / VARIANT / 'trn2.json'}: published claim {VARIANT}.trn2.step1_loss_hf"
        in err
    )
