"""Benchmark: D-interleaving from the MLP at a large batch — peak memory and throughput, same run.

Wide & Deep on Criteo-like fields (26 one-hot fields, dim 16, vocabularies capped at 100,000, 13
dense features), MLP 1024-512-256, Adagrad, batch 65,536 by default. Each variant trains in a
fresh subprocess of this script (``--child``), one after the other, with the same seeds, weights
and batches:

* ``whole``: ``hybridtf.keras.optimize(model)``, the whole batch per step;
* ``mlp_xN``: ``optimize(model, micro_batches=N, interleave_from="mlp")``: the lookup chains run
  once on the whole batch, the MLP and loss in N micro-batches, one update per step;
* ``mlpf_xN`` (``--fused``): the same with ``interleave_from="mlp_fused"`` (dense fusions kept).

Each child runs ``warmup`` untimed steps (tracing, optimizer slots), then ``steps`` timed steps
(``train_on_batch``; samples/s is the batch over the median step time). Peak memory of the step,
``peak_step_bytes``: the child's peak resident memory (``ru_maxrss``) minus its resident memory
just before the first step (model built, batches generated), so it is what training added:
feature maps, gradients, optimizer slots (the same in every variant), oneDNN buffers. TensorFlow's
own allocator peak (``tf.config.experimental.get_memory_info``) is reported too
(``allocator_peak_bytes``) but on CPU it misses most of a step: oneDNN keeps its own buffers and
only allocations of 256 KiB and more are counted. Per-step losses of every variant are compared
with ``whole``.

Writes ``bench_interleave.json`` and ``bench_interleave.png`` to ``--out-dir`` (default
``benchmarks/results/``) and prints one JSON object as the last line.

    python benchmarks/bench_interleave.py                          # batch 65,536, x4 (minutes)
    python benchmarks/bench_interleave.py --batch 8192 --micro 2,4 --steps 2 --warmup 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child(args) -> dict:
    import numpy as np
    import tensorflow as tf

    sys.path.insert(0, ROOT)
    import hybridtf as htf
    from hybridtf._src.models import ctr_data, ctr_models

    fields = ctr_data.criteo_like_fields(dim=16, max_vocab=100_000)
    hidden = tuple(int(h) for h in args.hidden.split(","))
    batches = [
        (ctr_data.to_tensors(x), tf.constant(y))
        for x, y in ctr_data.generate_batches(fields, 13, args.batch, args.warmup + args.steps, seed=5)
    ]
    model = ctr_models.wide_and_deep(fields, 13, hidden=hidden, seed=3)
    model(batches[0][0])
    options = {} if args.variant == "whole" else {"micro_batches": int(args.variant.split("_x")[1])}
    if options:
        options["interleave_from"] = "mlp_fused" if args.variant.startswith("mlpf") else "mlp"
    model = htf.keras.optimize(model, **options)
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.01), loss="binary_crossentropy")
    device = "CPU:0"
    with open("/proc/self/statm") as f:
        rss_before = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    losses, times, peaks = [], [], []
    for i, (x, y) in enumerate(batches):
        tf.config.experimental.reset_memory_stats(device)
        before = tf.config.experimental.get_memory_info(device)["current"]
        start = time.perf_counter()
        losses.append(float(model.train_on_batch(x, y)))
        elapsed = time.perf_counter() - start
        if i >= args.warmup:
            times.append(elapsed)
            peaks.append(tf.config.experimental.get_memory_info(device)["peak"] - before)
    median = statistics.median(times)
    return {
        "variant": args.variant,
        "batch": args.batch,
        "hidden": list(hidden),
        "losses": losses,
        "step_s": times,
        "samples_per_s": args.batch / median,
        "allocator_peak_bytes": int(max(peaks)),
        "rss_before_bytes": rss_before,
        "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_step_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before,
        "finite": bool(np.all(np.isfinite(losses))),
    }


def _run_child(args, variant: str) -> dict:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        "--variant",
        variant,
        "--batch",
        str(args.batch),
        "--hidden",
        args.hidden,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
    ]
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def _chart(results: list[dict], path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no chart"
    names = [r["variant"] for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    axes[0].bar(names, [r["peak_step_bytes"] / 2**20 for r in results], color="tab:blue")
    axes[0].set_ylabel("peak memory added by training (MiB)")
    axes[1].bar(names, [r["samples_per_s"] for r in results], color="tab:green")
    axes[1].set_ylabel("samples/s")
    fig.suptitle(f"W&D, batch {results[0]['batch']:,}, MLP {'-'.join(map(str, results[0]['hidden']))}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--hidden", default="1024,512,256")
    parser.add_argument("--micro", default="4", help="comma-separated micro-batch counts (from the MLP)")
    parser.add_argument("--fused", default="", help="micro-batch counts from the MLP with the dense fusions kept")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out-dir", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="whole", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args)))
        return 0
    variants = ["whole"] + [f"mlp_x{int(n)}" for n in args.micro.split(",")]
    variants += [f"mlpf_x{int(n)}" for n in args.fused.split(",") if n]
    results = [_run_child(args, v) for v in variants]
    whole = results[0]
    for r in results:
        w, m = (whole["losses"], r["losses"])
        r["loss_max_rel_diff"] = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(w, m))
        r["peak_vs_whole"] = r["peak_step_bytes"] / whole["peak_step_bytes"] if whole["peak_step_bytes"] else None
        r["throughput_vs_whole"] = r["samples_per_s"] / whole["samples_per_s"]
    print(f"{'variant':10} {'peak MiB':>10} {'vs whole':>9} {'samples/s':>10} {'vs whole':>9} {'loss rel diff':>14}")
    for r in results:
        peak_ratio = f"{r['peak_vs_whole']:.2f}x" if r["peak_vs_whole"] is not None else "n/a"
        print(
            f"{r['variant']:10} {r['peak_step_bytes'] / 2**20:10.1f} {peak_ratio:>9} {r['samples_per_s']:10.0f} "
            f"{r['throughput_vs_whole']:8.2f}x {r['loss_max_rel_diff']:14.2e}"
        )
    os.makedirs(args.out_dir, exist_ok=True)
    summary = {"config": vars(args), "cpu_count": os.cpu_count(), "load_avg": os.getloadavg(), "results": results}
    with open(os.path.join(args.out_dir, "bench_interleave.json"), "w") as f:
        json.dump(summary, f, indent=2)
    note = _chart(results, os.path.join(args.out_dir, "bench_interleave.png"))
    if note:
        print(note)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
