"""Ranks that diverge end with a clear error within a bound, never a hang (``horovodrun -np 2 --gloo``).

``hvd_fault_worker.py`` runs one scenario per launch with
``HYBRIDTF_COLLECTIVE_TIMEOUT_S=8`` (three launches at a time): rank 1 has fewer batches than rank 0 and
then calls ``save_weights``, ``evaluate`` or ``predict`` (rank 0 is still in a
training step), or saves an Estimator's final checkpoint, or evaluates an Estimator while rank 0 trains, or
restores another checkpoint (none) than rank 0's, or
ends its script, or raises in a
callback, or is killed, or its
step fails inside the graph in the middle of an interleaved (micro-batched,
K-interleaved) step. Every rank must
end with a non-zero status and an error naming the collective and the ranks
within the timeout plus the diagnosis grace (+ slack for a loaded machine).
Ranks that agree train and save with the watchdog armed in every run of
``test_horovod.py`` (default timeout).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.once import computed_once

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.xdist_group("test_rank_faults")]

WORKER = os.path.join(os.path.dirname(__file__), "hvd_fault_worker.py")
TIMEOUT_S = 8
SCENARIOS = (
    "uneven_save",
    "uneven_evaluate",
    "uneven_predict",
    "uneven_exit",
    "uneven_epochs",
    "raise",
    "kill",
    "interleaved",
    "estimator_uneven",
    "estimator_evaluate",
    "estimator_restore",
)
# timeout (+ half the grace on a first call) + diagnosis grace (min(15, timeout)) + Horovod shutdown and process
# exit, with slack for a loaded machine
BOUND_S = 2.5 * TIMEOUT_S + 10


def _launch(scenario, out):
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, WORKER, scenario, str(out)]
    env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "PYTHONUNBUFFERED": "1",
        "HYBRIDTF_COLLECTIVE_TIMEOUT_S": str(TIMEOUT_S),
    }
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, check=False)
    ended = time.time()
    output = proc.stdout + proc.stderr
    (out / f"{scenario}.log").write_text(output)
    diverged = [float(t) for t in re.findall(r"hybridtf-fault-test: rank \d diverges at ([\d.]+)", output)]
    return proc.returncode, output, ended - min(diverged) if diverged else None


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """Every scenario's (status, output, seconds from divergence to the end), three launches at a time."""

    def launch_all(out):
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            results = dict(zip(SCENARIOS, pool.map(lambda s: _launch(s, out), SCENARIOS)))
        (out / "launches.json").write_text(json.dumps(results))

    out = computed_once(tmp_path_factory, "rank_faults", launch_all)
    return {"dir": out, **{k: tuple(v) for k, v in json.loads((out / "launches.json").read_text()).items()}}


def _rank_lines(output, rank):
    return "\n".join(line for line in output.splitlines() if line.startswith(f"[{rank}]<"))


@pytest.mark.parametrize(
    ("scenario", "phase1"),
    [
        ("uneven_save", "checkpoint gather"),
        ("uneven_evaluate", "evaluation step"),
        ("uneven_predict", "prediction step"),
    ],
)
def test_uneven_batches_then_another_collective_end_every_rank(launches, scenario, phase1):
    code, output, elapsed = launches[scenario]
    assert code != 0, output[-3000:]
    assert elapsed is not None and elapsed < BOUND_S, f"ended {elapsed} s after the ranks diverged\n{output[-3000:]}"
    assert "done" not in re.findall(r"hybridtf-fault-test: rank \d (done)", output)
    for rank, own in ((0, "training step"), (1, phase1)):
        lines = _rank_lines(output, rank)
        # the watchdog's diagnosis, printed on stderr by every rank whose deadline passed
        timed_out = re.search(rf"rank {rank} of 2 waited [\d.]+ s in the collective {own}", lines)
        aborted = re.search(rf"CollectiveAbortedError: hybridtf: rank {rank} of 2 was in the collective {own}", lines)
        assert timed_out or aborted, f"rank {rank} printed no clear error:\n{lines[-4000:]}"
        if timed_out:
            assert "rank 0: training step" in lines and f"rank 1: {phase1}" in lines, lines[-4000:]
            assert "The ranks reached different collectives." in lines
            assert f"HYBRIDTF_COLLECTIVE_TIMEOUT_S={TIMEOUT_S}" in lines


def test_ranks_with_different_batch_counts_per_epoch_end_at_the_first_epochs_end(launches):
    """Before, each epoch's end was not a collective: the ranks' steps paired across epochs, silently."""
    code, output, _ = launches["uneven_epochs"]
    assert code != 0, output[-3000:]
    assert "hybridtf-fault-test: rank 1 diverges" not in output  # fit did not return on the shorter rank
    for rank, own in ((0, "training step #4"), (1, "end of epoch #1")):
        lines = _rank_lines(output, rank)
        timed_out = re.search(rf"rank {rank} of 2 waited [\d.]+ s in the collective {own}", lines)
        aborted = re.search(rf"CollectiveAbortedError: hybridtf: rank {rank} of 2 was in the collective {own}", lines)
        assert timed_out or aborted, f"rank {rank} printed no clear error:\n{lines[-4000:]}"
        if timed_out:
            assert "rank 0: training step #4" in lines and "rank 1: end of epoch #1" in lines, lines[-4000:]


def test_rank_that_finishes_its_data_and_exits_ends_the_others_in_a_custom_loop(launches):
    code, output, elapsed = launches["uneven_exit"]
    assert code != 0
    assert "hybridtf-fault-test: rank 1 done" in output
    # rank 0 ends with the abort, or, when rank 1 reached its end only after rank 0's deadline (a loaded
    # machine), with the watchdog's timeout: either way a clear error naming the collective, never a hang
    found = re.search(
        r"CollectiveAbortedError: hybridtf: rank 0 of 2 was in the collective custom phase #3 \(train step\)"
        r"|(CollectiveTimeoutError): hybridtf: rank 0 of 2 waited [\d.]+ s in the collective "
        r"custom phase #3 \(train step\)",
        output,
    )
    assert found
    # rank 0's own exception time, not the launcher's exit (Horovod's teardown takes seconds on a loaded machine):
    # within the watchdog's bound. The abort comes with rank 1's Horovod shutdown at its exit, which on a loaded
    # machine can take longer than rank 0's deadline: rank 0's watchdog then fires, and the abort can still arrive
    # during its diagnosis (CollectiveAbortedError after 20.6 s in one CI run; an idle machine: 0.04 s)
    bound = BOUND_S
    ends = {int(r): float(t) for r, t in re.findall(r"hybridtf-fault-test: rank (\d) ends at ([\d.]+)", output)}
    left = float(re.search(r"hybridtf-fault-test: rank 1 diverges at ([\d.]+)", output).group(1))
    assert ends[0] - left < bound, f"rank 0 ended {ends[0] - left} s after rank 1 left (launcher: {elapsed} s)"


def test_an_estimator_whose_ranks_have_uneven_data_ends_every_rank(launches):
    """Rank 1's input ends first: its final checkpoint gathers the shards while rank 0 waits in its next step.

    Both are armed: the gather (only until every rank joined it: a long write is not timed) and rank 0's
    training step (``estimator_step_watchdog.StepWatchdogHook``); each prints the diagnosis. Before, the gather
    hung; then rank 0's step was not timed and only Horovod's shutdown by rank 1 ended it."""
    code, output, elapsed = launches["estimator_uneven"]
    assert code != 0, output[-3000:]
    assert elapsed is not None and elapsed < BOUND_S, f"ended {elapsed} s after the ranks diverged\n{output[-3000:]}"
    assert "done" not in re.findall(r"hybridtf-fault-test: rank \d (done)", output)
    phases = ((0, r"training step #\d+ \(Estimator train\)"), (1, r"checkpoint gather \(Estimator checkpoint\)"))
    for rank, own in phases:
        lines = _rank_lines(output, rank)
        # printed on stderr before this rank shuts Horovod down: before any rank can end and horovodrun terminate
        # the others
        timed_out = re.search(rf"rank {rank} of 2 waited [\d.]+ s in the collective {own}", lines)
        assert timed_out, f"rank {rank} printed no clear error:\n{lines[-4000:]}"
        assert re.search(r"rank 0: training step #\d+", lines) and "rank 1: checkpoint gather" in lines, lines[-4000:]
        assert "The ranks reached different collectives." in lines
    # and raises it (rank 0: its session's coordinator raises it at the close), unless horovodrun terminated the
    # rank first when the other exited (a loaded machine)
    for rank in (0, 1):
        ended = re.search(rf"rank {rank} ends at [\d.]+ with CollectiveTimeoutError", output)
        terminated = re.search(rf"^\[{rank}\]<stderr>:Terminated$", output, re.MULTILINE)
        assert ended or terminated, output[-3000:]


def test_an_estimator_evaluated_on_one_rank_while_another_trains_ends_every_rank(launches):
    """Rank 1's evaluation steps exchange rows of the sharded tables; rank 0 is in its next train call (its
    first checkpoint's gather or a training step). Both are armed; before, only rank 0's gather was, and rank 1
    ended with Horovod's shutdown error, without the diagnosis."""
    code, output, elapsed = launches["estimator_evaluate"]
    assert code != 0, output[-3000:]
    assert elapsed is not None and elapsed < BOUND_S, f"ended {elapsed} s after the ranks diverged\n{output[-3000:]}"
    assert "done" not in re.findall(r"hybridtf-fault-test: rank \d (done)", output)
    own = {0: r"(training step #\d+ \(Estimator train\)|checkpoint gather \(Estimator checkpoint\))"}
    own[1] = r"evaluation step #\d+ \(Estimator eval\)"
    for rank in (0, 1):
        lines = _rank_lines(output, rank)
        assert re.search(rf"rank {rank} of 2 waited [\d.]+ s in the collective {own[rank]}", lines), lines[-4000:]
        assert re.search(r"rank 1: evaluation step #\d+", lines), lines[-4000:]
        ended = re.search(rf"rank {rank} ends at [\d.]+ with CollectiveTimeoutError", output)
        terminated = re.search(rf"^\[{rank}\]<stderr>:Terminated$", output, re.MULTILINE)
        assert ended or terminated, output[-3000:]


def test_estimator_ranks_that_would_restore_different_checkpoints_are_refused_before_any_step(launches):
    """Rank 1's model_dir is empty while rank 0's holds its checkpoint: the first save gathered mismatched
    tables (a Horovod shape error naming neither cause nor fix), or the ranks' schedules drifted apart."""
    code, output, _ = launches["estimator_restore"]
    assert code != 0, output[-3000:]
    for rank in (0, 1):
        assert re.search(
            rf"rank {rank} ends at [\d.]+ with ValueError: hybridtf.estimator: the Horovod ranks would restore "
            r"different checkpoints \(rank 0: step 2; rank 1: no checkpoint; this rank",
            output,
        ), output[-3000:]
    assert "Copy the same checkpoint into each rank's model_dir" in output
    assert "waited" not in output  # refused at once, not after a collective timed out


def test_exception_on_one_rank_ends_both_within_seconds(launches):
    code, output, _ = launches["raise"]
    assert code != 0
    assert "rank 1 fails on purpose after step 3" in output
    assert re.search(r"CollectiveAbortedError: hybridtf: rank 0 of 2 was in the collective training step #4", output)
    ends = {int(r): float(t) for r, t in re.findall(r"hybridtf-fault-test: rank (\d) ends at ([\d.]+)", output)}
    failed = float(re.search(r"hybridtf-fault-test: rank 1 diverges at ([\d.]+)", output).group(1))
    assert ends[0] - failed < 5, f"rank 0 ended {ends[0] - failed} s after rank 1 raised"


def test_killed_rank_ends_the_others_within_seconds(launches):
    code, output, elapsed = launches["kill"]
    assert code != 0
    killed = float(re.search(r"hybridtf-fault-test: rank 1 diverges at ([\d.]+)", output).group(1))
    ends = {int(r): float(t) for r, t in re.findall(r"hybridtf-fault-test: rank (\d) ends at ([\d.]+)", output)}
    if 0 in ends:
        # Gloo saw the closed connection first: Horovod shut down on rank 0 and its pending collective failed
        assert re.search(
            r"CollectiveAbortedError: hybridtf: rank 0 of 2 was in the collective training step #4", output
        ), output[-3000:]
        assert ends[0] - killed < 5, f"rank 0 ended {ends[0] - killed} s after rank 1 was killed"
    else:
        # horovodrun saw rank 1's exit first and terminated rank 0 before its abort surfaced (a loaded machine):
        # the job still ended, bounded, with the killed rank named
        assert "Process name: 1" in output and "Exit code: 137" in output, output[-3000:]
        assert elapsed is not None and elapsed < BOUND_S, f"ended {elapsed} s after rank 1 was killed"


def test_step_that_fails_inside_an_interleaved_step_ends_both_ranks(launches):
    code, output, _ = launches["interleaved"]
    assert code != 0, output[-3000:]
    assert "done" not in re.findall(r"hybridtf-fault-test: rank \d (done)", output)
    rank1 = _rank_lines(output, 1)
    assert "InvalidArgumentError" in rank1 and "a NaN label in an interleaved step" in rank1, rank1[-3000:]
    rank0 = _rank_lines(output, 0)
    timed_out = re.search(r"rank 0 of 2 waited [\d.]+ s in the collective training step #4", rank0)
    aborted = re.search(r"CollectiveAbortedError: hybridtf: rank 0 of 2 was in the collective training step #4", rank0)
    assert timed_out or aborted, f"rank 0 printed no clear error:\n{rank0[-4000:]}"
    ends = {int(r): float(t) for r, t in re.findall(r"hybridtf-fault-test: rank (\d) ends at ([\d.]+)", output)}
    started = float(re.search(r"hybridtf-fault-test: rank 1 diverges at ([\d.]+)", output).group(1))
    assert set(ends) == {0, 1}, output[-3000:]
    assert max(ends.values()) - started < BOUND_S, f"ended {max(ends.values()) - started} s after the step began"
