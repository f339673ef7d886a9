"""Issue 35, points 5 and 7, beyond the refusals: a golden judges only its own inputs, and a rendezvous ends.

Every bad input ``python -m harness run`` refuses before launch is a row of
tests/cpu/test_bad_inputs_table.py; that table names each test here with one row.
"""

from __future__ import annotations

import bad_inputs as b
import pytest
from bad_inputs import CORPUS

# --- goldens: never "accept" a golden for a run on other inputs ------------------------------------------------


@pytest.mark.parametrize("where", ["model_dir", "dataset_dir", "tokenizer_dir"])
def test_a_run_on_other_inputs_is_not_judged_against_the_tiers_golden(where, tmp_path):
    """A golden's "stale golden" advice (`make goldens ACCEPT=1`) is for a code change on its own inputs.

    Today: a run on a copy of the fixture with config.json's rms_norm_eps changed (allowed) was judged
    against `step1_loss_hf`, whose stale-golden message advises accepting the run's value.
    """
    from harness.judge.verdicts import golden_key
    from harness.options.run_options import RunOptions

    own = RunOptions(recipe="native_qwen3", init="hf").resolved()
    assert golden_key(own) == "step1_loss_hf"  # the control: the tier's own inputs are judged
    copy = (
        b.copy_fixture(tmp_path)
        if where != "dataset_dir"
        else b.corpus(CORPUS.read_bytes())(tmp_path)
    )
    other = RunOptions(recipe="native_qwen3", init="hf", **{where: copy}).resolved()
    assert golden_key(other) is None


# --- --nnodes 2 with no second node: a launch (this one case is about launching) ----------------------------


@pytest.mark.slow
def test_a_node_whose_peers_never_come_says_so_while_waiting_and_ends_at_the_rendezvous_timeout(
    tmp_path,
):
    """Today: nothing printed after the launch line for torch's default 600 s join timeout, then the report's
    KeyError: 'tokenizer' traceback. Now: a line every 15 s while waiting, and one ``why`` naming the rendezvous."""
    import socket
    import time

    from run_watch import RunWatch, describe

    from harness.checks.preflight import preflight
    from harness.launch.lifecycle import LaunchError, launch
    from harness.options.run_options import RunOptions

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{s.getsockname()[1]}"
    timeout_s = 20
    opts = preflight(
        RunOptions(
            recipe="native_qwen3",
            init="random",
            nproc=1,
            steps=1,
            export=False,
            nnodes=2,
            rdzv_endpoint=endpoint,
            rdzv_timeout=timeout_s,
            run_dir=tmp_path / "node0",
        )
    )
    lines: list[str] = []
    started = time.perf_counter()
    with RunWatch(tmp_path) as watch, pytest.raises(LaunchError) as failed:
        launch(opts, echo=lines.append)
    elapsed = time.perf_counter() - started
    left = watch.kill_left()
    watch.saw(
        torchrun=1
    )  # the watch saw the node's torchrun wait: "none left" is not a blind finder's
    assert left == [], f"left {describe(left)}"
    waiting = [line for line in lines if "waiting" in line]
    assert waiting and f"for all 2 nodes to join the rendezvous at {endpoint}" in waiting[0], lines
    assert failed.value.summary.startswith(
        f"the rendezvous at {endpoint} did not gather --nnodes 2 nodes within "
        f"--rdzv-timeout {timeout_s} s, so no rank started"
    ), failed.value.summary
    assert "\n" not in failed.value.summary
    assert timeout_s <= elapsed < timeout_s + 45, (
        f"the wait took {elapsed:.0f} s for --rdzv-timeout {timeout_s}"
    )
