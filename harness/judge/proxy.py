"""The 4B-width random-init proxy, scored forward-only from the host (``harness.rank.step1_forward`` in child ranks).

``run(opts)`` checks and resolves ``opts``, starts the scorer's ranks and returns what rank 0 measured;

    python -m harness.judge.proxy spread RECIPE --seeds N

scores the proxy (the main job's preset, ``harness.judge.verdicts.FULL_WIDTH_RANDOM_INIT``) for N init seeds
(from ``--first-seed``, default 0) and prints n, mean and standard deviation: what the proxies' tolerances
are set from.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.base.run_dir import STEP1_FORWARD_FILE
from harness.declare import catalogue
from harness.judge.verdicts import FULL_WIDTH_RANDOM_INIT
from harness.launch.lifecycle import child_env, write_run_file
from harness.options.run_options import RunOptions
from harness.rank.step1_forward import Step1ForwardError
from recipes.tiers import CPU

# --- host side -------------------------------------------------------------------------------


def command(opts: RunOptions, initial_state: bool = False) -> list[str]:
    """The scorer's command for resolved ``opts``: one process, or torchrun's ranks as ``harness.rank.train`` gets them."""
    launcher = [sys.executable]
    if opts.nproc > 1 or opts.nnodes > 1:
        launcher += [
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={opts.nproc}",
        ]
    return [*launcher, "-m", "harness.rank.step1_forward", "--run-dir", str(opts.run_dir)] + (
        ["--initial-state"] if initial_state else []
    )


def run(opts: RunOptions, initial_state: bool = False, timeout_s: float | None = None) -> dict:
    """Score ``opts`` (checked and resolved here) forward-only in child processes; rank 0's ``Step1Score``.

    Adds the children's wall and CPU time as the host saw them (``wall_s``, ``children_cpu_s``).
    """
    from harness.checks.preflight import preflight  # noqa: PLC0415 -- heavy: harness.checks.preflight imports torch (torch 2.9 s); this module stays light

    opts = preflight(opts)
    if opts.nnodes != 1:
        raise Step1ForwardError("the forward-only scorer runs on one node")
    write_run_file(opts)
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    out = subprocess.run(
        command(opts, initial_state),
        env=child_env(opts),
        capture_output=True,
        text=True,
        timeout=timeout_s or opts.tier_preset.launch_timeout_s,
    )
    after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - started
    if out.returncode != 0:
        raise Step1ForwardError(
            f"{' '.join(command(opts, initial_state))} exited {out.returncode}:\n{out.stderr[-4000:]}"
        )
    result = json.loads((opts.run_dir / STEP1_FORWARD_FILE).read_text())
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {**result, "wall_s": wall, "children_cpu_s": cpu}


def proxy_options(recipe: str, seed: int, run_dir: Path, **run) -> RunOptions:
    """The 4B-width random-init proxy of ``recipe``: the main job's preset (one layer, 2048 tokens, one process).

    A recipe whose catalogue entry declares ``Proxy(fixture_config=True)`` (harness.declare.catalogue) builds the real
    Qwen3-4B-Instruct-2507 config.json in fixtures/ (no weights) and reads the tier's tokenizer (random init
    loads nothing to disagree with), as the main job's run does.
    """
    from recipes.specs import QWEN3_4B_INSTRUCT_2507  # noqa: PLC0415 -- heavy: recipes.specs imports torch (torch 2.9 s); this module stays light

    proxy = catalogue.entry(recipe).proxy
    if proxy is None:
        raise KeyError(
            f"recipe {recipe!r} declares no 4B-width random-init proxy (harness/declare/catalogue.py)"
        )
    paths = (
        dict(model_dir=QWEN3_4B_INSTRUCT_2507, tokenizer_dir=CPU.tokenizer_dir)
        if proxy.fixture_config
        else {}
    )
    return RunOptions(
        recipe=recipe,
        tier="cpu",
        init="random",
        seed=seed,
        run_dir=run_dir,
        **paths,
        **run,
        **FULL_WIDTH_RANDOM_INIT,
    )


def spread(recipe: str, seeds: list[int], root: Path, echo=print) -> dict:
    """The proxy's step-1 loss over init ``seeds`` (the first batch is the same for every seed): n, mean, std."""
    losses = {}
    for seed in seeds:
        result = run(proxy_options(recipe, seed, root / f"{recipe}-seed{seed}"))
        losses[seed] = result["loss"]
        echo(
            f"{recipe} seed {seed}: {result['loss']!r} ({result['global_valid_tokens']} tokens, {result['wall_s']:.0f} s)"
        )
    values = list(losses.values())
    return {
        "recipe": recipe,
        "n": len(values),
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else float("nan"),
        "min": min(values),
        "max": max(values),
        "tokens": result["global_valid_tokens"],
        "losses": losses,
    }


def spread_main(argv: list[str]) -> int:

    parser = argparse.ArgumentParser(prog="python -m harness.judge.proxy spread")
    parser.add_argument("recipe", choices=catalogue.with_proxy())
    parser.add_argument("--seeds", type=int, default=10, help="init seeds 0..N-1")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the result here (JSON)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="step1-spread-") as root:
        result = spread(
            args.recipe, list(range(args.first_seed, args.first_seed + args.seeds)), Path(root)
        )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["spread"]:
        print(
            "usage: python -m harness.judge.proxy spread RECIPE [--seeds N] [--first-seed S] [--out FILE]",
            file=sys.stderr,
        )
        return 2
    return spread_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
