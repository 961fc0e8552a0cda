"""What the collective watchdog costs a training step: arming alone, and Keras fit under Horovod.

    python benchmarks/bench_watchdog.py arm            # in process: enter/exit of an armed phase
    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/bench_watchdog.py fit   # one timing run
    python benchmarks/bench_watchdog.py compare        # alternates fit runs with and without it

``fit`` trains a small W&D model (8 fields, global batch 512) for 40
warm-up and 5 x 40 timed steps and prints the best block's mean step time
(rank 0); run it
with ``HYBRIDTF_COLLECTIVE_TIMEOUT_S=0`` for the unguarded baseline.
``compare`` does both ``--repeats`` times, interleaved. Each mode prints one
JSON line last.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def bench_arm(calls: int = 200_000) -> dict:
    from hybridtf._src.distribute import watchdog
    from hybridtf._src.distribute.world import World

    world = World(0, 2, None)  # armed as a rank of two; never fires (long timeout)
    watchdog.set_collective_timeout(3600)
    with watchdog.collective_phase(world, watchdog.TRAINING_STEP):
        pass  # starts the thread
    start = time.perf_counter()
    for _ in range(calls):
        with watchdog.collective_phase(world, watchdog.TRAINING_STEP, "m", watchdog.next_seq("bench")):
            pass
    armed = (time.perf_counter() - start) / calls
    watchdog.set_collective_timeout(0)
    start = time.perf_counter()
    for _ in range(calls):
        with watchdog.collective_phase(world, watchdog.TRAINING_STEP, "m", watchdog.next_seq("bench")):
            pass
    disabled = (time.perf_counter() - start) / calls
    return {"mode": "arm", "calls": calls, "armed_us": armed * 1e6, "disabled_us": disabled * 1e6}


def bench_fit(warmup: int = 40, steps: int = 200) -> dict:
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    import hybridtf as htf
    from benchmarks import ctr_data, ctr_models

    hvd.init()
    fields = ctr_data.criteo_like_fields(dim=8, max_vocab=10_000)[:8]
    batch = 512 // hvd.size()
    x, y = ctr_data.generate_batch(fields, 4, batch, 0, seed=hvd.rank())
    data = tf.data.Dataset.from_tensors((ctr_data.to_tensors(x), np.asarray(y))).repeat()
    model = htf.keras.optimize(ctr_models.wide_and_deep(fields, 4, hidden=(64, 32), seed=1))
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    model.fit(data, steps_per_epoch=warmup, epochs=1, verbose=0)
    blocks = []
    for _ in range(5):  # the best block of steps/5: a shared machine's load shows up as slow blocks
        start = time.perf_counter()
        model.fit(data, steps_per_epoch=steps // 5, epochs=1, verbose=0)
        blocks.append((time.perf_counter() - start) / (steps // 5) * 1e3)
    timeout = htf.horovod.collective_timeout()
    return {"mode": "fit", "ranks": hvd.size(), "watchdog": timeout is not None, "step_ms": min(blocks)}


def compare(repeats: int = 3) -> dict:
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    runs = {"on": [], "off": []}
    for _ in range(repeats):
        for key, timeout in (("on", "35"), ("off", "0")):
            env = {**os.environ, "HYBRIDTF_COLLECTIVE_TIMEOUT_S": timeout, "TF_CPP_MIN_LOG_LEVEL": "3"}
            cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, __file__, "fit"]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
            line = next(ln for ln in reversed(out.splitlines()) if '"mode": "fit"' in ln)
            runs[key].append(json.loads(line[line.index("{") :])["step_ms"])
    return {
        "mode": "compare",
        "step_ms_on": runs["on"],
        "step_ms_off": runs["off"],
        "median_on": statistics.median(runs["on"]),
        "median_off": statistics.median(runs["off"]),
    }


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "arm"
    if mode == "arm":
        result = bench_arm()
    elif mode == "fit":
        result = bench_fit()
        if int(os.environ.get("HOROVOD_RANK", "0")) != 0:
            sys.exit(0)
    elif mode == "compare":
        result = compare(int(sys.argv[2]) if len(sys.argv) > 2 else 3)
    else:
        sys.exit(f"unknown mode {mode!r}: arm, fit or compare")
    print(json.dumps(result), flush=True)
