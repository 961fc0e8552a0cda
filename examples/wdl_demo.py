"""Demo: train Wide & Deep with and without hybridtf on the same synthetic CTR data.

The model is plain Keras code (hybridtf.models); hybridtf wraps it with
one line, ``htf.keras.optimize(model)``. Both train on identical batches from
identical initial weights; the demo prints the loss parity, the speedup and the
op-count reduction of the training step.

    ./dev.sh demo                              # 26 Criteo-like fields
    python examples/wdl_demo.py --fields 200   # 200 fields, mixed dims
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # hybridtf of the checkout when not installed

import numpy as np
import tensorflow as tf
from example_args import non_negative_int, positive_int

import hybridtf as htf
from hybridtf import models
from hybridtf.report import count_ops


class StepLog(tf.keras.callbacks.Callback):
    """Per-batch losses and wall-clock timestamps."""

    def __init__(self):
        super().__init__()
        self.losses, self.times = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))
        self.times.append(time.perf_counter())


def train(model, dataset, lr):
    model.compile(optimizer=tf.keras.optimizers.Adagrad(lr), loss="binary_crossentropy")
    log = StepLog()
    model.fit(dataset, epochs=1, verbose=0, callbacks=[log])
    return log


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fields", choices=["criteo", "26", "200"], default="criteo", help="criteo (= 26) or 200")
    parser.add_argument("--batch", type=positive_int, default=4096)
    parser.add_argument("--steps", type=positive_int, default=40)
    parser.add_argument("--warmup", type=non_negative_int, default=5, help="untimed first steps")
    parser.add_argument(
        "--max-shards", type=positive_int, default=None, help="planner: max shards per D-packing group (at least 1)"
    )
    args = parser.parse_args()
    if args.steps < args.warmup + 2:
        parser.error(
            f"--steps {args.steps} --warmup {args.warmup}: the throughput is timed over the steps after the "
            "warm-up, so --steps must be at least --warmup + 2"
        )

    if args.fields in ("criteo", "26"):
        fields = models.criteo_like_fields(dim=16, max_vocab=100_000)
    else:
        fields = models.many_fields(200, dims=(8, 16), multi_hot_fraction=0.0, seed=0)
    n_dense = 13
    print(f"Wide & Deep, {len(fields)} fields, batch {args.batch}, {args.steps} steps, Adagrad")
    batches = [
        (models.to_tensors(x), tf.constant(y))
        for x, y in models.generate_batches(fields, n_dense, args.batch, args.steps, seed=1)
    ]
    dataset = tf.data.Dataset.from_generator(
        lambda: iter(batches), output_signature=tf.nest.map_structure(tf.type_spec_from_value, batches[0])
    ).apply(tf.data.experimental.assert_cardinality(len(batches)))

    results = {}
    for name in ("plain", "hybridtf"):
        model = models.wide_and_deep(fields, n_dense, hidden=(64, 32), seed=1)
        model(batches[0][0])
        if name == "hybridtf":
            model = htf.keras.optimize(model, max_shards=args.max_shards)  # the one line
        log = train(model, dataset, 0.05)
        steady = np.diff(log.times[args.warmup :])
        results[name] = {
            "losses": np.array(log.losses),
            "samples_per_s": args.batch / float(np.median(steady)),
            "ops": count_ops(model, batches[0], grappler=False)["total"],
        }
        if name == "hybridtf":
            plan = model.hybridtf_plan
    plain, fast = results["plain"], results["hybridtf"]
    rel = np.abs(fast["losses"] - plain["losses"]) / np.abs(plain["losses"])
    print(f"packing plan: {len(plan.tables)} tables -> {len(plan.packed_tables)} packed tables")
    first, last = plain["losses"][0], plain["losses"][-1]
    print(
        f"loss parity over {args.steps} steps: max relative difference {rel.max():.2e} "
        f"(plain loss {first:.5f} -> {last:.5f})"
    )
    print(
        f"throughput: plain {plain['samples_per_s']:,.0f} samples/s, hybridtf {fast['samples_per_s']:,.0f} samples/s "
        f"-> {fast['samples_per_s'] / plain['samples_per_s']:.2f}x"
    )
    print(f"training-step ops: plain {plain['ops']:,}, hybridtf {fast['ops']:,} -> {fast['ops'] / plain['ops']:.1%}")


if __name__ == "__main__":
    main()
