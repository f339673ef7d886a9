"""The night's 64-rank launches (``harness.night.plan.LAUNCHES``), each made once per session, whichever test asks first.

A lane run serves several tests (step 1, the export round trip, the band, the
reference), so a run that stops early (config 1 as published may meet a non-finite
loss after step 1: ``inv_freq`` is uninitialised memory) keeps what it measured and
says why it stopped; a test that needs more than it got fails naming that.
The neuron tests run serially (``-p no:xdist``), so a module-level cache is the session's.

The host reference of a run's first batch starts as the launch ends, on one host worker beside the
next launches (the reference tests run after the last launch: tests/neuron/conftest.py), and a batch
another run already fed tonight is not scored again (``harness.night.plan``'s plan counts it so). A
diagnosis (suspects, a diagnosis lane) runs only when due (``harness.night.standing``); otherwise the
standing explanation of the night that measured it is carried.
"""

from __future__ import annotations

import functools
import math
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from neuron_cores import VISIBLE_CORES_ENV, neuron_core_body, on_neuron_cores

from harness.declare import catalogue
from harness.night import plan as nightly
from harness.night import standing
from harness.options import lanes

_RUNS: dict[str, "LaneRun"] = {}
_DUE: dict[str, standing.Due] = {}
#: The host worker: one reference forward at a time (its torch threads use the host's idle cores).
HOST = ThreadPoolExecutor(max_workers=1, thread_name_prefix="host-reference")
#: A first batch's sha256 (harness.reference.diagnosis.batch_key) -> its reference loss, scored once a night.
_SCORED: dict[str, float] = {}
#: How far the explained as-published number may move before its explanation is due again: the published
#: step-1 claims' tolerance (fixtures/goldens/*/trn2.json step1_loss_hf).
EXPLAINED_ATOL = 0.02


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
    _reference: Future | None = field(default=None, repr=False)

    @property
    def losses(self) -> list[float]:
        return self.result.get("losses") or []

    @property
    def run_dir(self) -> Path:
        return Path(self.result["run_dir"])

    def step1(self) -> float:
        """Step 1's loss; NaN when torchtitan stopped the run at a non-finite loss in step 1 (it raises before
        logging it; random init as published meets it too: inv_freq is uninitialised), a measurement too."""
        from harness.launch.failures import non_finite_stop

        if self.losses:
            return self.losses[0]
        stop = non_finite_stop(self.run_dir) if self.stopped is not None else None
        if stop is not None and stop[1] == 1:
            return math.nan
        pytest.fail(f"{self.launch.name} recorded no step: {self.stopped}", pytrace=False)

    def finished(self, what: str) -> None:
        """Fail the asking test, naming why, when the run did not reach its last step (``what`` needs it)."""
        if self.stopped is not None:
            pytest.fail(
                f"{what} not measured: {self.launch.name} stopped after {len(self.losses)} of "
                f"{self.launch.steps} steps: {self.stopped}",
                pytrace=False,
            )

    def start_reference(self) -> None:
        """Queue the host reference of step 1's batch on the host worker (once)."""
        if self._reference is None:
            self._reference = HOST.submit(self._score)

    def reference(self):
        """The host reference of step 1's batch (``harness.reference.diagnosis``), diagnosed when due, else carrying the
        standing diagnosis; waits for the host worker."""
        self.start_reference()
        return self._reference.result()

    def _score(self):
        from harness.reference import diagnosis as reference

        started = time.monotonic()
        key = reference.batch_key(self.run_dir)
        if key is None:
            pytest.fail(
                f"{self.launch.name} recorded no first batch ({self.run_dir}/first_batch)",
                pytrace=False,
            )
        diagnosing = not self.launch.suspects or diagnosis_due(self.launch.name, None).due
        check = reference.check_run_dir(
            self.run_dir,
            always_diagnose=diagnosing,
            diagnose=diagnosing,
            allow_no_step=True,
            model=reference_model(str(self.opts.model_dir)),
            known_reference=_SCORED.get(key),
        )
        _SCORED[key] = check.reference
        if not diagnosing:
            check.suspects = reference.ReferenceCheck.from_dict(
                _DUE[self.launch.name].standing["result"]
            ).suspects
        self.reference_min = (time.monotonic() - started) / 60
        return check

    def standing_record(self) -> dict:
        """Tonight's standing record of this run's diagnosis (measured, or carried), for ``standing.<launch>``."""
        due = diagnosis_due(self.launch.name, None)
        return standing.record(
            due, self.reference().to_dict(), explains=explained_number(self.launch, None)
        )


def explained_number(spec: nightly.Launch, shared_dir: Path | None) -> float | None:
    """The as-published step 1 a diagnosis explains (its own, for an as-published lane's suspects)."""
    if not (spec.explains or spec.suspects):
        return None
    target = spec.explains or spec.name
    if shared_dir is None and target not in _RUNS:
        pytest.fail(f"{spec.name} explains {target}, which has not launched", pytrace=False)
    return lane_run(target, shared_dir).step1()


def diagnosis_due(name: str, shared_dir: Path | None) -> standing.Due:
    """Whether launch ``name``'s on-change result (a diagnosis lane, the torchtitan.train check, an as-published
    lane's suspects) is due tonight; decided once a session. ``shared_dir`` is needed only when what it explains
    has not launched yet."""
    if name not in _DUE:
        from harness.base.environment import versions
        from harness.config.provenance import input_key

        spec = nightly.LAUNCHES[name]
        lane = catalogue.LANES[spec.lane]
        inputs = input_key(
            spec.options(checkout=lanes.titan_checkout()[0]), list(lane.kept_defects)
        )
        fp = standing.fingerprint(versions(), inputs, standing.suite_code_sha256())
        _DUE[name] = standing.decide(name, fp, explained_number(spec, shared_dir), EXPLAINED_ATOL)
    return _DUE[name]


def diagnosis(name: str, shared_dir: Path, record_property):
    """A diagnosis lane's reference check: launched and scored when due, else the standing one carried. Records
    tonight's decision and standing record either way."""
    from harness.reference import diagnosis as reference

    due = diagnosis_due(name, shared_dir)
    record_property(f"trn2.{name}.due", {"due": due.due, "why": due.why})
    if due.due:
        run = lane_run(name, shared_dir)
        record_property(f"{standing.PROPERTY_PREFIX}{name}", run.standing_record())
        return run.reference()
    record_property(f"{standing.PROPERTY_PREFIX}{name}", standing.record(due, {}))
    return reference.ReferenceCheck.from_dict(due.standing["result"])


@functools.cache
def reference_model(model_dir: str):
    """The weights in fp32 on the host (~16 GiB at 4B), loaded once for every lane."""
    from harness.reference import diagnosis as reference

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
    from harness.config.build import as_configured, checked_config

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
    from harness.config.provenance import input_key
    from harness.launch.lifecycle import LaunchError, launch
    from harness.options.run_options import RunOptions

    spec = nightly.LAUNCHES[name]
    lane = catalogue.LANES[spec.lane]
    checkout, why = lanes.titan_checkout()
    if (lane.titan_dataset or lane.titan_tokenizer) and checkout is None:
        pytest.fail(why, pytrace=False)
    started = time.monotonic()
    opts = RunOptions.from_json(
        on_neuron_cores(
            checked_lane_options,
            name,
            str(shared_dir / name),
            str(checkout) if checkout else None,
            os.environ.get(VISIBLE_CORES_ENV),
        )
    )
    stopped = None
    with lanes.lane_env(lane):
        try:
            # The watchdog's budgets from the plan's estimate; a stall raises a LaunchError like any failed
            # launch: recorded as stopped, and the night goes on with its next launch.
            budgets = nightly.watchdog_budgets(name)
            result = launch(opts, echo=lambda line: None, budgets=budgets).to_dict()
        except LaunchError as e:
            if e.result is None:
                raise
            result, stopped = e.result.to_dict(), e.summary
    inputs = result.get("provenance", {}).get("inputs") or input_key(opts, list(lane.kept_defects))
    _RUNS[name] = LaneRun(
        spec, opts, result, inputs, stopped, launch_min=(time.monotonic() - started) / 60
    )
    if spec.reference:
        _RUNS[name].start_reference()  # on the host worker, beside the next launches
    return _RUNS[name]


def measured() -> dict[str, dict]:
    """What this session's launches took, by name (``harness.night.plan.measured_lines`` sets it beside the plan)."""
    return {
        name: {
            "launch_min": run.launch_min,
            "reference_min": run.reference_min,
            "steps": len(run.losses),
            "stopped": run.stopped,
        }
        for name, run in _RUNS.items()
    }
