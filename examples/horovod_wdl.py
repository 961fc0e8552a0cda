"""Hybrid parallel Wide & Deep under Horovod: sharded packed embeddings, allreduced dense layers.

The model is plain Keras code; the script is a standard Horovod Keras script
(``hvd.init()``, ``hvd.DistributedOptimizer``, the broadcast callback, each
rank reading its own part of the data) plus ``htf.keras.optimize``. The same
script runs as one process or under ``horovodrun``:

    python examples/horovod_wdl.py                                      # one process
    horovodrun -np 2 -H localhost:2 --gloo python examples/horovod_wdl.py
    horovodrun -np 16 -H host1:8,host2:8 --gloo python examples/horovod_wdl.py --batch 65536

Every rank prints its shard sizes; rank 0 prints the loss, the global
examples/s and the bytes each rank sends per step (estimated on a batch).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # hybridtf of the checkout when not installed

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from example_args import positive_int

import hybridtf as htf
from hybridtf import models
from hybridtf._src.distribute.traffic import estimate_traffic


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--batch", type=positive_int, default=4096, help="global batch size (split over the ranks; a multiple of them)"
    )
    parser.add_argument("--steps", type=positive_int, default=30, help="at least 3: 2 warm-up steps, then timed ones")
    parser.add_argument(
        "--fields",
        type=positive_int,
        default=26,
        help="26: Criteo-like fields (one-hot, dim 16); any other count n: n generated fields "
        "(mixed dims 8/16/32, about 10%% of them multi-hot)",
    )
    parser.add_argument("--strategy", choices=("mod", "range"), default="mod", help="how rows spread over ranks")
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error(f"--steps must be at least 3 (2 warm-up steps, then the timed ones), got {args.steps}")

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if args.batch < size or args.batch % size:
        parser.error(f"--batch {args.batch} must be a positive multiple of the {size} ranks")
    local_batch = args.batch // size
    if args.fields == 26:
        fields = models.criteo_like_fields(dim=16, max_vocab=100_000)
    else:
        fields = models.many_fields(args.fields, seed=0)
    n_dense = models.CRITEO_NUM_DENSE

    # Each rank generates (in a real job: reads) its own rows of every global batch.
    data = models.make_dataset(fields, n_dense, local_batch, args.steps, seed=1000 + rank)
    sample = next(iter(data))

    model = models.wide_and_deep(fields, n_dense, hidden=(64, 32), seed=0)
    model(sample[0])
    model = htf.keras.optimize(model, shard_strategy=args.strategy)  # after hvd.init(): shards over the ranks
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.Adagrad(0.05)), loss="binary_crossentropy")

    shards = htf.horovod.local_variables(model)
    held = ", ".join(f"{v.name} {v.shape.as_list()}" for v in shards) or "every row of every table (one process)"
    print(f"[rank {rank}/{size}] holds {held}")
    if size > 1 and rank == 0:
        global_sample = next(iter(models.make_dataset(fields, n_dense, args.batch, 1, seed=7)))[0]
        for r in estimate_traffic(model, global_sample, size)["per_rank"]:
            sent = f"alltoall {r['alltoall_bytes']:,} B, allreduce {r['allreduce_bytes']:,} B"
            print(f"  rank {r['rank']} sends per step: {sent}")

    model.fit(data.take(2), verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])  # warm-up
    start = time.perf_counter()
    history = model.fit(data.skip(2), verbose=0)
    elapsed = time.perf_counter() - start
    loss = float(hvd.allreduce(tf.constant(history.history["loss"][-1]), op=hvd.Average, name="final_loss"))

    ckpt = os.path.join(tempfile.gettempdir(), "hybridtf_horovod_wdl", "ckpt")
    model.save_weights(ckpt)  # every rank calls it: the shards are gathered, rank 0 writes whole tables
    if rank == 0:
        steps = args.steps - 2
        print(
            f"ranks {size}: loss {loss:.4f}, {steps * args.batch / elapsed:,.0f} examples/s (global batch {args.batch})"
        )
        print(f"checkpoint with whole tables (restores on any number of ranks or the plain model): {ckpt}")
    return 0 if np.isfinite(loss) else 1


if __name__ == "__main__":
    sys.exit(main())
