"""The rank module of the per-recipe figures: ``harness.rank.train`` with torchtitan's logger switched on.

``harness.rank.train`` leaves torchtitan's logger unconfigured, so torchtitan's own
per-step line (loss, tps, tflops, **mfu** from its peak-FLOPS table, memory) is
never printed. This entry initialises it exactly as ``torchtitan.train`` does and
then runs ``harness.rank.train.main`` unchanged, so MFU is torchtitan's number.
"""

from __future__ import annotations

import sys


def main() -> int:
    from harness.rank.train import main as recipes_train_main  # noqa: PLC0415 -- heavy: harness.rank.train imports torch (torch 2.9 s); this module stays light
    from recipes.titan import init_logger  # noqa: PLC0415 -- heavy: recipes.titan imports torchtitan (torchtitan+torch 2.9 s); this module stays light

    init_logger()
    return recipes_train_main()


if __name__ == "__main__":
    sys.exit(main())
