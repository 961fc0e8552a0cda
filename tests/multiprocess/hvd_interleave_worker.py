"""One process of the interleaving Horovod test: micro-batched and K-interleaved W&D, losses as JSON.

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
import hvd_worker

STEPS = 15
SCENARIOS = {
    "micro_embedding": dict(micro_batches=2, interleave_from="embedding"),
    "micro_mlp": dict(micro_batches=2, interleave_from="mlp"),
    "groups": dict(interleave_groups=2),
    "groups_micro": dict(interleave_groups=2, micro_batches=2, interleave_from="embedding"),
}


def main():
    out = sys.argv[1]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    batches = hvd_worker.global_batches(steps=STEPS)
    result = {"rank": rank, "size": size}
    for name, options in SCENARIOS.items():
        _, result[name] = hvd_worker.fit(
            "wdl", tf.keras.optimizers.Adagrad(0.05), rank, size, batches=batches, **options
        )
    with open(os.path.join(out, f"interleave_{size}_{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
