"""Plain vs ``hybridtf.keras.optimize`` on a hand-written Wide & Deep (``benchmarks.handwritten_models``).

The model is written as users write it: by default a subclassed model whose ``call`` concatenates the deep
embeddings with ``tf.concat`` and whose wide part is a Keras ``Add`` of the per-field dim-1 embeddings. Both
models are built from the same seed, trained with Adagrad in the same run, timed alternately (best of
``--repeats``; wall time, and the process's CPU time, which other tenants of a loaded machine disturb
less), and their training steps' ops are counted (``hybridtf.report.count_ops``: as traced, and after
Grappler, which also drops the unused ops a rewrite leaves behind). The last line printed is one JSON object.

Two ways of running the steps are timed. ``step_ms`` / ``cpu_ms``: ``model.fit`` over a cached
``tf.data`` dataset of the batches (how ``bench_keras.py`` times the project's own models, and how
models are trained). ``train_on_batch_ms`` / ``train_on_batch_cpu_ms``: one ``train_on_batch`` call
per step, which adds Keras's per-call work (a one-batch ``tf.data`` pipeline over the 201 input
tensors, built in Python on every call: about as much CPU time as the optimized step itself) to both
models alike, so its ratio is lower.

Example:
    python -m benchmarks.bench_handwritten --fields 200 --batch 4096 --steps 10 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import tensorflow as tf

import hybridtf as htf
from benchmarks import handwritten_models as hm
from hybridtf.report import count_ops


def _time(model, batches, steps: int) -> tuple[float, float]:
    """Wall and process CPU seconds per step of ``steps`` train_on_batch calls (after the first, which traces)."""
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(steps):
        x, y = batches[i % len(batches)]
        model.train_on_batch(x, y)
    return (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps


def _time_fit(model, dataset, steps: int) -> tuple[float, float]:
    """Wall and process CPU seconds per step of one ``fit`` of ``steps`` steps (traced before)."""
    start, cpu = time.perf_counter(), time.process_time()
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
    return (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps


def _dataset(batches) -> tf.data.Dataset:
    """The batches, cached, repeated: ``fit``'s input."""
    dataset = tf.data.Dataset.from_tensors(batches[0])
    for b in batches[1:]:
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors(b))
    return dataset.cache().repeat()


def _ms(best: dict) -> dict:
    return {k: round(v * 1e3, 1) for k, v in best.items()}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fields", type=int, default=200)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--style", choices=hm.STYLES, default="subclassed")
    parser.add_argument("--wide", choices=hm.WIDE_SUMS, default="add")
    parser.add_argument("--max-vocab", type=int, default=20_000)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    vocabs = [int(v) for v in np.exp(rng.uniform(np.log(100), np.log(args.max_vocab), args.fields))]
    batches = [hm.batch(vocabs, 13, args.batch, seed=s) for s in range(4)]
    dataset = _dataset(batches)
    models = {}
    for name in ("plain", "optimized"):
        model = hm.wide_and_deep(args.style, args.wide, vocabs, dim=args.dim, n_dense=13, hidden=(64, 32))
        if name == "optimized":
            model = htf.keras.optimize(model)
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
        model.train_on_batch(*batches[0])  # trace
        model.fit(dataset, steps_per_epoch=1, epochs=1, verbose=0)  # trace fit's step
        models[name] = model
    ops = {name: count_ops(m, batches[0]) for name, m in models.items()}
    best = {(how, name): float("inf") for how in ("fit", "tob") for name in models}
    best_cpu = dict(best)
    for _ in range(args.repeats):
        for name, model in models.items():
            for how, (wall, cpu) in (
                ("fit", _time_fit(model, dataset, args.steps)),
                ("tob", _time(model, batches, args.steps)),
            ):
                best[how, name], best_cpu[how, name] = min(best[how, name], wall), min(best_cpu[how, name], cpu)

    def pick(table, how):
        return {name: table[how, name] for name in models}

    fit, fit_cpu, tob, tob_cpu = pick(best, "fit"), pick(best_cpu, "fit"), pick(best, "tob"), pick(best_cpu, "tob")
    result = {
        "model": f"handwritten_wdl/{args.style}/{args.wide}",
        "fields": args.fields,
        "batch": args.batch,
        "step_ms": _ms(fit),
        "speedup": round(fit["plain"] / fit["optimized"], 2),
        "cpu_ms": _ms(fit_cpu),
        "cpu_ratio": round(fit_cpu["plain"] / fit_cpu["optimized"], 2),
        "train_on_batch_ms": _ms(tob),
        "train_on_batch_speedup": round(tob["plain"] / tob["optimized"], 2),
        "train_on_batch_cpu_ms": _ms(tob_cpu),
        "train_on_batch_cpu_ratio": round(tob_cpu["plain"] / tob_cpu["optimized"], 2),
        "ops_traced": {k: v["total"] for k, v in ops.items()},
        "ops_grappler": {k: v["grappler_total"] for k, v in ops.items()},
        "ops_kept_traced": round(ops["optimized"]["total"] / ops["plain"]["total"], 3),
        "ops_kept_grappler": round(ops["optimized"]["grappler_total"] / ops["plain"]["grappler_total"], 3)
        if ops["plain"]["grappler_total"]
        else None,
        "fused_concats": models["optimized"].hybridtf_fused_concats,
        "fused_dense": models["optimized"].hybridtf_fused_dense,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
