"""Training throughput with dynamic tables: DynamicEmbedding vs a tf.lookup table vs static packed tables.

One model, three storages for its F one-hot fields (26 or 200), run in the same
process on the same batches (Zipf ids, raw 64-bit values for the dynamic
variants, their ranks for the static one), Keras ``fit`` with Adagrad:

* ``dynamic``: one ``hybridtf.layers.DynamicEmbedding`` per field (HybridHash,
  fused lookup and update, ``dynamic_optimizer``): one store and one chain per field;
* ``dynamic_packed``: the same model through ``hybridtf.keras.optimize``: the
  fields share ONE packed HybridHash store keyed by (field, id), one chain
  (unique, lookup, gather) and one fused update per step;
* ``tf_lookup``: what a user writes today without hybridtf: per field a
  ``tf.lookup.experimental.MutableHashTable`` id -> row index, new ids get the
  next free rows of a ``[capacity, dim]`` variable, gather + Keras' sparse
  update;
* ``static_packed``: ``tf.keras.layers.Embedding`` per field over the ranks,
  packed by ``hybridtf.keras.optimize`` (the upper bound: no hashing at all).

The dynamic tables flush their hot tier every ``--flush-every`` steps (default 100, the layer's
default; the user guide calls 100-1000 typical) after 5 warm-up steps; the default 105 steps time
steps 6-105, one whole flush period with its flush.

Prints samples/s per variant and one JSON line; writes JSON + PNG to ``--out-dir``.
Short runs: the numbers are for comparing variants in one run, not absolute.
``--repeats N`` runs the variants N times, alternating, and keeps each one's
best (a shared machine's load changes between runs).

    python benchmarks/bench_hybrid_hash_throughput.py [--fields 26] [--batch 1024] [--steps 105] [--repeats 3]

``--profile`` instead profiles the steps after the warm-up of each variant
(TF profiler) and prints the op self-time per step by op type (host CPU ops).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

import hybridtf as htf

REPO = Path(__file__).resolve().parent.parent


class TfLookupEmbedding(tf.keras.layers.Layer):
    """A dynamic table in plain TF: MutableHashTable id -> index, rows in a variable, ids inserted on first sight."""

    def __init__(self, capacity, dim, **kwargs):
        super().__init__(**kwargs)
        self.capacity, self.dim = capacity, dim

    def build(self, input_shape):
        self.rows = self.add_weight("rows", (self.capacity, self.dim), initializer="uniform")
        self.next_row = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.index = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=-1)

    def call(self, ids, training=None):
        flat = tf.reshape(ids, [-1])
        unique, inverse = tf.unique(flat)
        found = tf.reshape(self.index.lookup(unique), [-1])
        missing = tf.boolean_mask(unique, found < 0)
        n_new = tf.size(missing, out_type=tf.int64)
        start = self.next_row.assign_add(n_new) - n_new
        new_rows = start + tf.range(n_new)
        with tf.control_dependencies([self.index.insert(missing, new_rows)]):
            rows_index = tf.reshape(self.index.lookup(unique), [-1])
        emb = tf.gather(self.rows, tf.gather(rows_index, inverse))
        return tf.reshape(emb, tf.concat([tf.shape(ids), [self.dim]], 0))


VARIANTS = ("dynamic_packed", "dynamic", "tf_lookup", "static_packed")


def make_model(fields, dim, kind, vocab, flush_every=100):
    inputs = [tf.keras.Input((1,), dtype=tf.int64, name=f"f{i}") for i in range(fields)]
    outs = []
    for i, x in enumerate(inputs):
        if kind in ("dynamic", "dynamic_packed"):
            layer = htf.layers.DynamicEmbedding(
                dim, hot_rows=vocab // 5, warmup_steps=5, flush_every=flush_every, name=f"emb{i}"
            )
        elif kind == "tf_lookup":
            layer = TfLookupEmbedding(vocab, dim, name=f"emb{i}")
        else:
            layer = tf.keras.layers.Embedding(vocab, dim, name=f"emb{i}")
        outs.append(tf.keras.layers.Flatten()(layer(x)))
    h = tf.keras.layers.Concatenate()(outs)
    h = tf.keras.layers.Dense(64, activation="relu")(h)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1, activation="sigmoid")(h))
    opt = tf.keras.optimizers.Adagrad(0.05)
    if kind in ("dynamic", "dynamic_packed"):
        opt = htf.keras.dynamic_optimizer(opt)
    if kind in ("static_packed", "dynamic_packed"):
        model = htf.keras.optimize(model)
    model.compile(optimizer=opt, loss="binary_crossentropy")
    return model


def batches(fields, batch, steps, vocab, seed=0):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1) ** 1.05
    p /= p.sum()
    hashes = rng.integers(-(2**62), 2**62, size=(fields, vocab), dtype=np.int64)
    ranks = [rng.choice(vocab, size=(steps * batch, 1), p=p) for _ in range(fields)]
    y = rng.integers(0, 2, size=(steps * batch, 1)).astype(np.float32)
    raw = {f"f{i}": hashes[i][ranks[i]] for i in range(fields)}
    static = {f"f{i}": ranks[i].astype(np.int64) for i in range(fields)}
    return raw, static, y


class _Timer(tf.keras.callbacks.Callback):
    def __init__(self, skip):
        super().__init__()
        self.skip, self.times = skip, []

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter())


def run_variant(kind, args, raw, static, y):
    model = make_model(args.fields, args.dim, kind, args.vocab, args.flush_every)
    x = static if kind == "static_packed" else raw
    timer = _Timer(args.warmup)
    model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, shuffle=False, callbacks=[timer])
    t = timer.times[args.warmup :]
    return args.batch * (len(t) - 1) / (t[-1] - t[0])


def profile_variant(kind, args, raw, static, y, top=25):
    """Op type -> self-time (ms per step) of ``kind``'s steps after the warm-up; prints the top ones."""
    import collections
    import sys
    import tempfile

    if str(REPO) not in sys.path:  # run as a script: benchmarks/ is sys.path[0], not the repository
        sys.path.insert(0, str(REPO))
    from benchmarks.profile_keras import host_op_events

    model = make_model(args.fields, args.dim, kind, args.vocab, args.flush_every)
    x = static if kind == "static_packed" else raw
    n = args.batch * args.warmup
    model.fit({k: v[:n] for k, v in x.items()}, y[:n], batch_size=args.batch, verbose=0, shuffle=False)
    logdir = tempfile.mkdtemp(prefix="profile_hh_")
    rest = {k: v[n:] for k, v in x.items()}
    steps = (len(y) - n) // args.batch
    start = time.perf_counter()
    tf.profiler.experimental.start(logdir)
    model.fit(rest, y[n:], batch_size=args.batch, verbose=0, shuffle=False)
    tf.profiler.experimental.stop()
    wall = (time.perf_counter() - start) / steps * 1e3
    by_type = collections.Counter()
    for _, op_type, ps in host_op_events(logdir):
        by_type[op_type] += ps * 1e-9 / steps
    total = sum(by_type.values())
    print(f"{args.fields} fields, {kind}: {wall:.1f} ms/step wall (profiled), op self-time {total:.1f} ms")
    for op_type, ms in by_type.most_common(top):
        print(f"  {op_type:40s} {ms:8.2f} ms")
    return by_type


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fields", type=int, default=26)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=105, help="steps per run, warm-up included")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--flush-every",
        type=int,
        default=100,
        help="Algorithm 1's flush interval (DynamicEmbedding's default; the timed steps should span a whole one)",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(VARIANTS),
        help=f"some of {', '.join(VARIANTS)} (space- or comma-separated)",
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="profile each variant instead of timing it")
    parser.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    args.variants = [v for arg in args.variants for v in arg.split(",") if v]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {unknown}: choose from {', '.join(VARIANTS)}")
    raw, static, y = batches(args.fields, args.batch, args.steps, args.vocab)
    if args.profile:
        for kind in args.variants:
            profile_variant(kind, args, raw, static, y)
            tf.keras.backend.clear_session()
        return
    results, runs = {}, {kind: [] for kind in args.variants}
    for _ in range(args.repeats):
        for kind in args.variants:
            runs[kind].append(run_variant(kind, args, raw, static, y))
            tf.keras.backend.clear_session()
            print(f"{args.fields} fields, {kind:14s} {runs[kind][-1]:10.0f} samples/s", flush=True)
    results = {kind: max(r) for kind, r in runs.items()}
    payload = {
        "benchmark": "hybrid_hash_throughput",
        "args": {k: str(v) for k, v in vars(args).items()},
        "samples_per_s": results,
        "runs": runs,
        "load_average": os.getloadavg(),
    }
    for dyn in ("dynamic", "dynamic_packed"):
        for other in ("tf_lookup", "static_packed"):
            if dyn in results and other in results:
                payload[f"{dyn}_over_{other}"] = results[dyn] / results[other]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"bench_hybrid_hash_throughput-{args.fields}f-{stamp}"
    (args.out_dir / f"{name}.json").write_text(json.dumps(payload, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.bar(list(results), list(results.values()))
        ax.set_ylabel("samples/s")
        ax.set_title(f"{args.fields} fields, batch {args.batch}, Adagrad (loaded 2-core CPU)")
        fig.tight_layout()
        fig.savefig(args.out_dir / f"{name}.png", dpi=110)
    except ImportError:
        print("matplotlib is not installed: no chart")
    print(json.dumps(payload))


if __name__ == "__main__":
    main()
