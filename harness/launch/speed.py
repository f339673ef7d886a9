"""How fast one run trained: step time, tokens/s, MFU, time to the first step, NEFF cache.

The launcher computes these once per run, after its ranks have ended
(``record_run``), so results.json, results.md and the runs log all show the same
numbers. With ``QWEN3_RUNS_LOG`` set, each run also appends one JSON line to that
file: the nightly keeps it across nights and ``python -m harness history`` plots it.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.base.environment import versions as installed_versions
from harness.checks.kernels import tier_lnc
from harness.declare.published import CLAIMS
from recipes.tiers import REPO_ROOT, rehearsal_mark

#: The JSON-lines file each run appends its record to (unset: nothing is appended).
RUNS_LOG_ENV = "QWEN3_RUNS_LOG"
#: The night a record belongs to (default: the UTC date); tests and re-runs name it.
NIGHT_ENV = "QWEN3_NIGHT"

#: Dense BF16 peak of one *physical* NeuronCore, per tier. aws-neuron/aws-neuron-sdk
#: about-neuron/arch/neuron-hardware/neuron-core-v3.rst: "A NeuronCore-v3 Tensor Engine
#: delivers 158 cFP8 TFLOPS, and 79 BF16/FP16/TF32 TFLOPS" (torchtitan's peak table uses
#: the same 79e12). A logical core at LNC=2 is two physical cores: 158 TFLOPS.
#: (The same docs' trainium2.rst gives 667 BF16 TFLOPS per 8-core chip, 83.4 per core;
#: the per-core page is the one that states a per-core figure.)
PEAK_BF16_TFLOPS_PER_PHYSICAL_CORE = {"trn2": 79.0}
PEAK_SOURCE = (
    "aws-neuron/aws-neuron-sdk about-neuron/arch/neuron-hardware/neuron-core-v3.rst: "
    "79 BF16 TFLOPS per NeuronCore-v3, x LNC per logical core"
)

#: Where TorchNeuron keeps compiled NEFFs across runs, in the order it is looked up:
#: ``TORCH_NEURONX_NEFF_CACHE_DIR`` (aws-neuron/aws-neuron-sdk torch/reference/env-vars.rst,
#: "compilation caching"; compiler/about-compiler-artifacts.rst: step 4 "stores the NEFF in the
#: persistent NEFF cache"), then the Neuron persistent cache's ``NEURON_COMPILE_CACHE_URL``
#: (frameworks/torch/torch-neuronx/api-reference-guide/training/torch-neuron-envvars.rst,
#: default /var/tmp/neuron-compile-cache).
NEFF_CACHE_ENVS = ("TORCH_NEURONX_NEFF_CACHE_DIR", "NEURON_COMPILE_CACHE_URL")
NEFF_CACHE_DEFAULT = "/var/tmp/neuron-compile-cache"


#: The figures ``python -m harness history`` plots across nights, with their axis labels.
SPEED_FIGURES = {
    "step_time_s": "s/step (step 1 excluded)",
    "tokens_per_s": "tokens/s per rank",
    "tokens_per_s_node": "tokens/s per node",
    "tflops": "TFLOPS per rank",
    "mfu_pct": "MFU % (BF16 peak)",
    "time_to_first_step_s": "s from launch to the end of step 1",
    "neffs_compiled": "NEFFs compiled during the run",
}
#: The NEFF cache states as plotted numbers ("n/a" and "unknown" are not plotted).
NEFF_STATES = {"warm": 1.0, "partial": 0.5, "cold": 0.0}


@dataclass
class Speed:
    """One run's speed figures (None: not measured; a string says why for the NEFF cache)."""

    #: Mean seconds per step, step 1 (compile, warm-up) excluded when there are later steps.
    step_time_s: float | None
    #: torchtitan's tokens/s of one rank, same steps.
    tokens_per_s: float | None
    #: tokens/s of all ranks of this node (tokens_per_s x nproc).
    tokens_per_s_node: float | None
    #: TFLOPS one rank achieved (torchtitan's ``tflops``: flops per token x tokens/s).
    tflops: float | None
    #: The peak one rank (one logical core) could reach, BF16 dense; None where there is no stated peak.
    peak_tflops: float | None
    mfu_pct: float | None
    #: Launch to the end of step 1: start-up, compile and load, and step 1 itself.
    time_to_first_step_s: float | None
    #: "warm" (no NEFF compiled during the run, some cached), "cold" (none cached before),
    #: "partial" (some compiled, some cached), "n/a" (no Neuron device on this tier).
    neff_cache: str
    neff_cache_dir: str | None = None
    neffs_cached_before: int | None = None
    neffs_compiled: int | None = None
    peak_source: str | None = None


def _mean(values: list) -> float | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.fmean(values) if values else None


def steady(steps: list[dict]) -> list[dict]:
    """The steps after step 1 (compile, warm-up), or step 1 alone when it is the only one."""
    return steps[1:] or steps


def peak_tflops(tier: str) -> float | None:
    """BF16 peak of one rank's logical core on ``tier`` (None on cpu: no stated peak)."""
    per_core = PEAK_BF16_TFLOPS_PER_PHYSICAL_CORE.get(tier)
    if per_core is None:
        return None

    return per_core * tier_lnc(tier)


def neff_cache_dir() -> Path:
    """The NEFF cache directory this process's ranks use (``NEFF_CACHE_ENVS``, else the default)."""
    for name in NEFF_CACHE_ENVS:
        value = os.environ.get(name, "")
        if value and not value.startswith("s3://"):
            return Path(value.removeprefix("file://"))
    return Path(NEFF_CACHE_DEFAULT)


def neff_cache_state(started_unix_s: float, cache: Path) -> tuple[str, int | None, int | None]:
    """("warm" | "cold" | "partial" | "unknown", NEFFs there before the run, NEFFs written since it started).

    A NEFF the run compiled has an mtime after the launch started; one it found cached does not.
    """
    if not cache.is_dir():
        return "unknown", None, None
    mtimes = []
    for path in cache.rglob("*.neff"):
        try:
            mtimes.append(path.stat().st_mtime)
        except OSError:
            continue
    compiled = sum(1 for m in mtimes if m >= started_unix_s)
    before = len(mtimes) - compiled
    if not mtimes:  # nothing cached, nothing written: caching is off or the NEFFs went elsewhere
        return "unknown", 0, 0
    state = "warm" if compiled == 0 else "cold" if before == 0 else "partial"
    return state, before, compiled


def run_speed(steps: list[dict], tier: str, nproc: int, started_unix_s: float | None) -> Speed:
    """The speed figures of a run's ``steps.jsonl`` records on ``tier``."""
    rest = steady(steps)
    tps = _mean([s.get("tokens_per_s") for s in rest])
    tflops = _mean([s.get("tflops") for s in rest])
    peak = peak_tflops(tier)
    first_end = steps[0].get("unix_s") if steps else None
    to_first = (
        first_end - started_unix_s if first_end is not None and started_unix_s is not None else None
    )
    speed = Speed(
        step_time_s=_mean([s.get("step_time_s") for s in rest]),
        tokens_per_s=tps,
        tokens_per_s_node=tps * nproc if tps is not None else None,
        tflops=tflops,
        peak_tflops=peak,
        mfu_pct=100 * tflops / peak if tflops is not None and peak else None,
        time_to_first_step_s=to_first,
        neff_cache="n/a",
        peak_source=PEAK_SOURCE if peak else None,
    )
    if tier != "cpu" and started_unix_s is not None:
        cache = neff_cache_dir()
        speed.neff_cache, speed.neffs_cached_before, speed.neffs_compiled = neff_cache_state(
            started_unix_s, cache
        )
        speed.neff_cache_dir = str(cache)
    return speed


def git_commit() -> str | None:
    """The suite's own commit (None outside a git checkout)."""

    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def run_label(run_dir: str) -> str:
    """A run's name across nights: its directory name without the launcher's -YYYYMMDD-HHMMSS stamp
    (and the -N that ``harness.base.run_dir.claim`` adds when two launches share a second)."""
    name = Path(run_dir).name
    match = re.fullmatch(r"(.+)-\d{8}-\d{6}(?:-\d+)?", name)
    return match.group(1) if match else name


def run_record(result: dict, versions: dict | None = None, night: str | None = None) -> dict:
    """The runs-log line of one finished run (``RunResult.to_dict()``): what it measured and how fast."""

    now = time.gmtime()
    losses = result.get("losses") or [s.get("loss") for s in result.get("steps") or []]
    claim = CLAIMS.get(f"step1_loss_{result.get('init')}")
    return {
        "kind": "run",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", now),
        "night": night or os.environ.get(NIGHT_ENV) or time.strftime("%Y-%m-%d", now),
        "commit": git_commit(),
        "versions": installed_versions() if versions is None else versions,
        "label": run_label(result["run_dir"]),
        **{
            k: result.get(k)
            for k in (
                "recipe",
                "tier",
                "init",
                "nproc",
                "seq_len",
                "local_batch_size",
                "returncode",
            )
        },
        "steps": len(result.get("steps") or []),
        "step1_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "published": {"key": claim.key, "value": claim.value} if claim else None,
        "speed": result.get("speed") or {},
        **rehearsal_mark(),
    }


def append_record(path: Path, record: dict) -> None:
    """Append one line (O_APPEND: concurrent runs' lines do not interleave)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record, default=str, sort_keys=True) + "\n")


def record_run(result) -> None:
    """Fill ``result.speed`` (a ``harness.launch.lifecycle.RunResult``) and append it to ``$QWEN3_RUNS_LOG`` if set."""
    result.speed = asdict(run_speed(result.steps, result.tier, result.nproc, result.started_unix_s))
    log = os.environ.get(RUNS_LOG_ENV)
    if not log:
        return
    try:
        append_record(Path(log), run_record(result.to_dict()))
    except OSError as e:  # the run itself is kept and reported; only its log line is lost
        print(
            f"harness.launch.speed: could not append to ${RUNS_LOG_ENV}={log}: {e}", file=sys.stderr
        )
