"""The published claims a tier must judge, from each recipe's catalogue entry: declared in code, never
discovered from files, so deleting a goldens file cannot take a claim out of the nightly gate
(``harness.judge.gate.disagreements`` holds the files to this declaration)."""

from __future__ import annotations

import dataclasses

from harness.declare import catalogue
from harness.declare.published import CLAIMS, Claim


def published_claims(tier: str) -> list[Claim]:
    """Every claim a night on ``tier`` must measure and judge: one per judge the catalogue declares."""
    claims = []
    for judge in catalogue.CLAIM_JUDGES.values():
        recipe, claim_tier, key = judge.claim.split(".", 2)
        if claim_tier == tier:
            claims.append(dataclasses.replace(CLAIMS[key], recipe=recipe, tier=tier))
    return claims
