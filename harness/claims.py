"""The published claims of a tier: the published-lane goldens a night on that tier must measure and judge."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness import goldens


@dataclass(frozen=True)
class Claim:
    """One published-lane golden: what a night on ``tier`` must measure."""

    recipe: str
    tier: str
    key: str
    value: object

    @property
    def name(self) -> str:
        return f"{self.recipe}.{self.tier}.{self.key}"


def published_claims(tier: str, goldens_dir: Path | None = None) -> list[Claim]:
    """Every published-lane value of ``<goldens_dir>/*/<tier>.json``, in file order."""
    goldens_dir = goldens_dir or goldens.GOLDENS_DIR
    claims = []
    for path in sorted(goldens_dir.glob(f"*/{tier}.json")):
        recipe = path.parent.name
        _, values = goldens.load(recipe, tier, path)
        claims += [Claim(recipe, tier, g.key, g.value) for g in values.values() if g.lane == "published"]
    return claims
