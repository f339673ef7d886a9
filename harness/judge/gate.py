"""The goldens files held to the claims a tier must judge (``harness.declare.claims``): the gate's other half.

The claims come from the catalogue in code; a goldens file that is missing or that disagrees with them (a claim
gone, moved to another lane, another value, or a published golden nobody declared) would change what the night
requires without a word, so ``require-claims`` and ``make test`` fail on each, one line naming file and claim.
"""

from __future__ import annotations

from pathlib import Path

from harness.declare.claims import published_claims
from harness.judge import goldens


def disagreements(tier: str, goldens_dir: Path | None = None) -> list[str]:
    """Where the goldens files leave the claims ``tier`` must judge (``harness.declare.claims``): one line each,
    naming the file and the claim. A missing file, a claim gone, moved to another lane or given another value,
    or a published golden no catalogue entry declares: each would change what the gate requires."""
    goldens_dir = goldens_dir or goldens.GOLDENS_DIR
    declared = published_claims(tier)
    found, files = [], {}
    where = "declared in harness/declare/catalogue.py"
    for claim in declared:
        path = goldens_dir / claim.recipe / f"{tier}.json"
        if claim.recipe not in files:
            try:
                files[claim.recipe] = goldens.load(claim.recipe, tier, path)[1]
            except goldens.GoldenError as e:
                files[claim.recipe] = None
                found.append(f"{path}: cannot hold the published claims {where} ({e})")
        values = files[claim.recipe]
        if values is None:
            found.append(f"{path}: published claim {claim.name} ({where}) has no golden")
            continue
        golden = values.get(claim.key)
        if golden is None:
            found.append(
                f"{path}: published claim {claim.name} ({where}) has no golden {claim.key!r}"
            )
        elif golden.lane != "published":
            found.append(
                f"{path}: claim {claim.name} is on lane {golden.lane!r}; {where} as lane 'published'"
            )
        elif golden.value != claim.value:
            found.append(
                f"{path}: claim {claim.name} holds {golden.value!r}; the tutorial's is {claim.value!r}"
            )
    names = {c.name for c in declared}
    for recipe, values in files.items():
        for golden in (values or {}).values():
            name = f"{recipe}.{tier}.{golden.key}"
            if golden.lane == "published" and name not in names:
                found.append(
                    f"{goldens_dir / recipe / f'{tier}.json'}: published golden {name} has no judge {where}"
                )
    for path in sorted(goldens_dir.glob(f"*/{tier}.json")):
        if path.parent.name not in files:
            values = goldens.load(path.parent.name, tier, path)[1]
            stray = [g.key for g in values.values() if g.lane == "published"]
            if stray:
                found.append(f"{path}: published goldens {stray} of a recipe with no judge {where}")
    return found
