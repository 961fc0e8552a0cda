"""What the collective watchdog costs a training step: arming alone, and Keras fit under Horovod.

    python benchmarks/bench_watchdog.py arm            # in process: enter/exit of an armed phase
    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/bench_watchdog.py fit

``fit`` trains a small W&D model (8 fields, global batch 512) for 40
warm-up steps, then 8 rounds of two 40-step blocks, one with the watchdog
armed (35 s) and one with it off, and prints the best and median block's
mean step time of each (rank 0). Each mode prints one JSON line last.
"""

from __future__ import annotations

import json
import os
import statistics
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


def bench_fit(warmup: int = 40, rounds: int = 8, steps: int = 40) -> dict:
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    import hybridtf as htf
    from hybridtf._src.models import ctr_data, ctr_models

    hvd.init()
    fields = ctr_data.criteo_like_fields(dim=8, max_vocab=10_000)[:8]
    batch = 512 // hvd.size()
    x, y = ctr_data.generate_batch(fields, 4, batch, 0, seed=hvd.rank())
    data = tf.data.Dataset.from_tensors((ctr_data.to_tensors(x), np.asarray(y))).repeat()
    model = htf.keras.optimize(ctr_models.wide_and_deep(fields, 4, hidden=(64, 32), seed=1))
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    model.fit(data, steps_per_epoch=warmup, epochs=1, verbose=0)
    blocks = {"on": [], "off": []}
    for _ in range(rounds):  # interleaved blocks in the same job: the shared machine's load drifts
        for key, timeout in (("on", 35), ("off", 0)):
            htf.horovod.set_collective_timeout(timeout)  # every rank switches at the same step
            start = time.perf_counter()
            model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)
            blocks[key].append((time.perf_counter() - start) / steps * 1e3)
    return {
        "mode": "fit",
        "ranks": hvd.size(),
        "steps_per_block": steps,
        "best_step_ms_on": min(blocks["on"]),
        "best_step_ms_off": min(blocks["off"]),
        "median_step_ms_on": statistics.median(blocks["on"]),
        "median_step_ms_off": statistics.median(blocks["off"]),
    }


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "arm"
    if mode == "arm":
        result = bench_arm()
    elif mode == "fit":
        result = bench_fit()
        if int(os.environ.get("HOROVOD_RANK", "0")) != 0:
            sys.exit(0)
    else:
        sys.exit(f"unknown mode {mode!r}: arm or fit")
    print(json.dumps(result), flush=True)
