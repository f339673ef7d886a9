"""The night's 64-rank launches (``harness.nightly.LAUNCHES``), each made once per session, whichever test asks first.

A lane run serves several tests (step 1, the export round trip, the band, the
reference), so a run that stops early (config 1 as published may meet a non-finite
loss after step 1: ``inv_freq`` is uninitialised memory) keeps what it measured and
says why it stopped; a test that needs more than it got fails naming that.
The neuron tests run serially (``-p no:xdist``), so a module-level cache is the session's.
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness import catalogue, lanes, nightly
from neuron_cores import VISIBLE_CORES_ENV, neuron_core_body, on_neuron_cores

_RUNS: dict[str, "LaneRun"] = {}


@dataclass
class LaneRun:
    """One launch's result (maybe partial), its resolved options and its input key."""

    launch: nightly.Launch
    opts: object
    result: dict
    inputs: dict
    #: Why the run stopped before its last step (None: it finished).
    stopped: str | None = None
    #: Wall minutes of the launch (its checks, start-up, compile, steps, export) and of its host reference.
    launch_min: float = 0.0
    reference_min: float | None = None
    _reference: object = field(default=None, repr=False)

    @property
    def losses(self) -> list[float]:
        return self.result.get("losses") or []

    @property
    def run_dir(self) -> Path:
        return Path(self.result["run_dir"])

    def step1(self) -> float:
        """Step 1's loss; NaN when torchtitan stopped the run at a non-finite loss in step 1 (it raises before
        logging it; random init as published meets it too: inv_freq is uninitialised), a measurement too."""
        from harness.launch import non_finite_stop

        if self.losses:
            return self.losses[0]
        stop = non_finite_stop(self.run_dir) if self.stopped is not None else None
        if stop is not None and stop[1] == 1:
            return math.nan
        pytest.fail(f"{self.launch.name} recorded no step: {self.stopped}", pytrace=False)

    def finished(self, what: str) -> None:
        """Fail the asking test, naming why, when the run did not reach its last step (``what`` needs it)."""
        if self.stopped is not None:
            pytest.fail(f"{what} not measured: {self.launch.name} stopped after {len(self.losses)} of "
                        f"{self.launch.steps} steps: {self.stopped}", pytrace=False)  # fmt: skip

    def reference(self):
        """The host reference of step 1's batch (``harness.reference``), always diagnosed; computed once."""
        if self._reference is None:
            from harness import reference

            started = time.monotonic()
            self._reference = reference.check_run_dir(
                self.run_dir, always_diagnose=True, allow_no_step=True, model=reference_model(str(self.opts.model_dir))
            )
            self.reference_min = (time.monotonic() - started) / 60
            if self._reference is None:
                pytest.fail(f"{self.launch.name} recorded no first batch ({self.run_dir}/first_batch)", pytrace=False)
        return self._reference


@functools.cache
def reference_model(model_dir: str):
    """The weights in fp32 on the host (~16 GiB at 4B), loaded once for every lane."""
    from harness import reference

    return reference.load_reference_model(Path(model_dir))


@neuron_core_body
def checked_lane_options(name: str, run_dir: str, checkout: str | None, visible: str | None) -> str:
    """In a child: the launcher's own checks and config for launch ``name`` (``checked_config``, as
    ``python -m harness run`` does), returned as the resolved options' JSON.

    Building config 3 imports the TorchTitan Neuron fork's ``qwen3_nki_moe_config``: a fork that fails
    to import, or touches the device at import, fails this launch's tests, never the pytest process,
    and holds nothing once the child has exited (before torchrun starts). The checks judge the
    runner's own ``NEURON_RT_VISIBLE_CORES`` (``visible``), not the core this child was lent.
    """
    from harness.config import as_configured, checked_config

    os.environ.pop(VISIBLE_CORES_ENV, None)
    if visible is not None:
        os.environ[VISIBLE_CORES_ENV] = visible
    spec = nightly.LAUNCHES[name]
    with lanes.lane_env(catalogue.LANES[spec.lane]):
        options = spec.options(run_dir=Path(run_dir), checkout=Path(checkout) if checkout else None)
        opts, config = checked_config(options)
        return as_configured(opts, config).to_json()


def lane_run(name: str, shared_dir: Path) -> LaneRun:
    """The launch ``name`` of the plan, made on first use; later callers get the same result."""
    if name in _RUNS:
        return _RUNS[name]
    from harness.launch import LaunchError, launch
    from harness.options import RunOptions
    from harness.provenance import input_key

    spec = nightly.LAUNCHES[name]
    lane = catalogue.LANES[spec.lane]
    checkout, why = lanes.titan_checkout()
    if (lane.titan_dataset or lane.titan_tokenizer) and checkout is None:
        pytest.fail(why, pytrace=False)
    started = time.monotonic()
    opts = RunOptions.from_json(
        on_neuron_cores(
            checked_lane_options, name, str(shared_dir / name), str(checkout) if checkout else None,
            os.environ.get(VISIBLE_CORES_ENV),
        )  # fmt: skip
    )
    stopped = None
    with lanes.lane_env(lane):
        try:
            result = launch(opts, echo=lambda line: None).to_dict()
        except LaunchError as e:
            if e.result is None:
                raise
            result, stopped = e.result.to_dict(), e.summary
    inputs = result.get("provenance", {}).get("inputs") or input_key(opts, list(lane.kept_defects))
    _RUNS[name] = LaneRun(spec, opts, result, inputs, stopped, launch_min=(time.monotonic() - started) / 60)
    return _RUNS[name]


def measured() -> dict[str, dict]:
    """What this session's launches took, by name (``harness.nightly.measured_lines`` sets it beside the plan)."""
    return {name: {"launch_min": run.launch_min, "reference_min": run.reference_min, "steps": len(run.losses),
                   "stopped": run.stopped} for name, run in _RUNS.items()}  # fmt: skip
