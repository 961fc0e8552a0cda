"""One process of the interleaving Horovod test: micro-batched and K-interleaved W&D, losses as JSON.

Also a custom ``htf.function`` loop with ``htf.micro_batch_gradients`` and
``htf.horovod.average_gradients`` (``custom_micro``).

Run by tests/multiprocess/test_horovod_interleave.py as one process and under
``horovodrun -np 2 -H localhost:2 --gloo``; rank ``r`` trains on its half of
every global batch (``hvd_worker.local_part``).

    python tests/multiprocess/hvd_interleave_worker.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvdk
import hvd_worker

import hybridtf as htf
from hybridtf._src.models import ctr_data

STEPS = 15
SCENARIOS = {
    "micro_embedding": dict(micro_batches=2, interleave_from="embedding"),
    "micro_mlp": dict(micro_batches=2, interleave_from="mlp"),
    "groups": dict(interleave_groups=2),
    "groups_micro": dict(interleave_groups=2, micro_batches=2, interleave_from="embedding"),
    # warm-up measured on each rank, planned from rank 0's numbers on every rank (Eq. 3 with a tiny capacity)
    "groups_auto": dict(interleave_groups="auto", interleave_scale=1e-6),
    # hvd.DistributedOptimizer averages in minimize's gradient step, which the micro-batched step replaces
    "micro_hvd_optimizer": dict(micro_batches=2, interleave_from="embedding"),
}


def custom_micro(rank, size, steps=STEPS):
    """htf.function loop: micro_batch_gradients (2 micro-batches) + average_gradients, plain Adagrad."""
    fs = hvd_worker.fields()
    model = hvd_worker.build("wdl", fs, seed=3)
    model(hvd_worker.eval_batch(fs))
    model = htf.keras.optimize(model)
    optimizer = tf.keras.optimizers.Adagrad(0.05)
    loss_fn = tf.keras.losses.BinaryCrossentropy()
    variables = model.trainable_variables

    @htf.function
    def step(x, y):
        loss, grads = htf.micro_batch_gradients(
            lambda b: loss_fn(b[1], model(b[0], training=True)), (x, y), variables, micro_batches=2
        )
        optimizer.apply_gradients(zip(htf.horovod.average_gradients(grads, variables, model), variables))
        return loss

    losses = []
    for b in hvd_worker.global_batches(fs, steps, seed=5):
        x, y = hvd_worker.local_part(b, rank, size)
        losses.append(float(step(ctr_data.to_tensors(x), tf.constant(y))))
    return losses


def main():
    out = sys.argv[1]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    batches = hvd_worker.global_batches(steps=STEPS)
    result = {"rank": rank, "size": size}
    for name, options in SCENARIOS.items():
        optimizer = tf.keras.optimizers.Adagrad(0.05)
        if name == "micro_hvd_optimizer":
            optimizer = hvdk.DistributedOptimizer(optimizer)
        model, result[name] = hvd_worker.fit("wdl", optimizer, rank, size, batches=batches, **options)
        result[name + "_groups"] = [list(g.members) for g in model.hybridtf_interleaving.groups]
    result["custom_micro"] = custom_micro(rank, size)
    if size > 1:  # an invalid id on rank 1 in micro-batch 1 of an interleaved step: both ranks fail, none hangs
        model = hvd_worker.build("wdl")
        model(hvd_worker.eval_batch())
        model = htf.keras.optimize(model, micro_batches=2, interleave_groups=2)
        model.compile(optimizer="sgd", loss="binary_crossentropy")
        x, y = hvd_worker.local_part(batches[0], rank, size)
        if rank == 1:
            x["C2"] = x["C2"].copy()
            x["C2"][20] = 10_000
        try:
            model.train_on_batch(ctr_data.to_tensors(x), y)
            result["invalid_error"] = None
        except tf.errors.InvalidArgumentError as err:
            result["invalid_error"] = err.message
    with open(os.path.join(out, f"interleave_{size}_{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
