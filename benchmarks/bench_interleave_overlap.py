"""Benchmark (b): K-interleaving groups and micro-batches under Horovod — steps/s and measured overlap.

PICASSO's Fig. 14 on this machine. Wide & Deep, 24 one-hot fields of dims 8 / 16 / 32
(vocabulary 20,000 each, sharded over the ranks), MLP 256-128, Adagrad, a fixed per-rank batch.
``optimize`` makes four packed tables (the three deep dims and the wide dim-1 table), so the
K-interleaving plan has 1 to 4 groups. One ``horovodrun -np 2 -H localhost:2 --gloo`` job (the
``--worker`` mode) builds every configuration — ``groups`` in ``--groups`` (an int or ``auto``:
the planner's Eq. 3 from its warm-up) x ``micro_batches`` in ``--micro`` (from the embedding
layer) — then times them in ``--rounds`` rounds, each round running every configuration for
``--steps`` steps in turn (alternating, so that the other engineers' load on the shared cores
spreads over all of them). Last, each configuration is profiled for ``--profile-steps`` steps
(``tf.profiler``) and ``trace_overlap.analyze`` takes from the trace the time a Horovod
collective was in flight, the kernel time, and their overlap (the share of exchange time
overlapped with compute). The same worker without ``horovodrun`` (``--ranks 1``) gives the
one-process numbers the cost model (``bench_interleave_model.py``) is checked against.

Writes ``bench_interleave_overlap.json`` and ``.png`` to ``--out-dir`` (default
``benchmarks/results/``) and prints one JSON object as the last line.

    python benchmarks/bench_interleave_overlap.py                     # 2 ranks and 1 rank (minutes)
    python benchmarks/bench_interleave_overlap.py --groups 1,auto --micro 1 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def fields():
    from hybridtf._src.models import ctr_data

    dims = (8, 16, 32)
    return [ctr_data.FieldSpec(f"c{i}", 20_000, dims[i % 3]) for i in range(24)]


def _configs(args) -> list[tuple[str, object, int]]:
    out = []
    for g in args.groups.split(","):
        for n in args.micro.split(","):
            groups = g if g == "auto" else int(g)
            out.append((f"g{g}_m{n}", groups, int(n)))
    return out


def _link(hvd, tf, size) -> dict:
    """Measured alltoall latency (8-byte) and bandwidth (16 MiB) between the ranks (loopback Gloo)."""
    if size == 1:
        return {"latency_s": 0.0, "bytes_per_s": None}
    small = tf.zeros([size], tf.float32)
    big = tf.zeros([size * (4 << 20) // size], tf.float32)  # 16 MiB, 1/size to each rank
    for _ in range(3):
        hvd.alltoall(small)
        hvd.alltoall(big)
    lat, bw = [], []
    for _ in range(10):
        t = time.perf_counter()
        hvd.alltoall(small)
        lat.append(time.perf_counter() - t)
    for _ in range(5):
        t = time.perf_counter()
        hvd.alltoall(big)
        bw.append(time.perf_counter() - t)
    sent = 16 * 2**20 * (size - 1) / size
    return {"latency_s": statistics.median(lat), "bytes_per_s": sent / max(statistics.median(bw), 1e-9)}


def _worker(args) -> dict:
    import numpy as np
    import tensorflow as tf

    import hybridtf as htf
    from benchmarks import trace_overlap
    from hybridtf._src.models import ctr_data, ctr_models

    size, rank, hvd = 1, 0, None
    if args.ranks > 1:
        import horovod.tensorflow as hvd

        hvd.init()
        size, rank = hvd.size(), hvd.rank()
    fs = fields()
    data = [
        (ctr_data.to_tensors(x), tf.constant(y))
        for x, y in ctr_data.generate_batches(fs, 13, args.batch, 4, seed=100 + rank)
    ]
    link = _link(hvd, tf, size)
    models = {}
    for name, groups, micro in _configs(args):
        model = ctr_models.wide_and_deep(fs, 13, hidden=(256, 128), seed=3)
        model(data[0][0])
        options = {"micro_batches": micro, "interleave_from": "embedding"}
        if groups == "auto" or groups > 1:
            options["interleave_groups"] = groups
        model = htf.keras.optimize(model, **options)
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.01), loss="binary_crossentropy")
        for i in range(args.warmup):  # tracing, slots, the "auto" warm-up steps
            model.train_on_batch(*data[i % len(data)])
        models[name] = model
    times = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            for i in range(args.steps):
                start = time.perf_counter()
                model.train_on_batch(*data[i % len(data)])
                times[name].append(time.perf_counter() - start)
    results = []
    for name, groups, micro in _configs(args):
        model = models[name]
        logdir = tempfile.mkdtemp(prefix=f"htf_overlap_{name}_r{rank}_")
        tf.profiler.experimental.start(logdir)
        for i in range(args.profile_steps):
            model.train_on_batch(*data[i % len(data)])
        tf.profiler.experimental.stop()
        trace = trace_overlap.analyze(logdir)
        shutil.rmtree(logdir, ignore_errors=True)
        plan = model.hybridtf_interleaving
        median = statistics.median(times[name])
        results.append(
            {
                "config": name,
                "groups_requested": groups,
                "groups": plan.num_groups if plan is not None else 1,
                "group_members": [list(g.members) for g in plan.groups] if plan is not None else None,
                "micro_batches": micro,
                "step_s_median": median,
                "step_s": times[name],
                "steps_per_s": 1.0 / median,
                "trace": trace,
            }
        )
    traffic = None
    if size > 1:
        from hybridtf._src.distribute.traffic import estimate_traffic

        x_global = {k: np.concatenate([np.asarray(v)] * size) for k, v in data[0][0].items()}
        t = estimate_traffic(models[_configs(args)[0][0]], ctr_data.to_tensors(x_global), size)
        traffic = t["per_rank"][rank]
    names = [pt.name for pt in models[_configs(args)[0][0]]._htf_runtime.plan.packed_tables]
    return {
        "rank": rank,
        "ranks": size,
        "batch_per_rank": args.batch,
        "packed_tables": names,
        "link": link,
        "traffic_per_rank": traffic,
        "results": results,
    }


def _launch(args, ranks: int, out: str) -> list[dict]:
    script = [sys.executable, os.path.abspath(__file__), "--worker", "--out", out, "--ranks", str(ranks)]
    for key in ("batch", "groups", "micro", "rounds", "steps", "warmup", "profile_steps"):
        script += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    if ranks > 1:
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        script = [horovodrun, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo", *script]
    subprocess.run(script, check=True, env=env, capture_output=True, text=True, timeout=3000)
    found = []
    for r in range(ranks):
        with open(os.path.join(out, f"overlap_{ranks}_{r}.json")) as f:
            found.append(json.load(f))
    return found


def _chart(two: list[dict], path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no chart"
    res = two[0]["results"]
    names = [r["config"] for r in res]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.4
    pos = range(len(names))
    axes[0].bar([p - width / 2 for p in pos], [r["steps_per_s"] for r in res], width, label="median step")
    axes[0].bar([p + width / 2 for p in pos], [1 / min(r["step_s"]) for r in res], width, label="fastest step")
    axes[0].set_xticks(list(pos), names)
    axes[0].set_ylabel("steps/s (rank 0)")
    axes[0].legend(fontsize=8)
    axes[1].bar(names, [100 * (r["trace"]["overlap_share"] or 0) for r in res], color="tab:blue")
    axes[1].set_ylabel("exchange time overlapped with compute (%)")
    for ax in axes:
        ax.tick_params(axis="x", rotation=45)
    fig.suptitle(f"W&D, 2 ranks (Gloo, loopback), batch {two[0]['batch_per_rank']:,}/rank; gG_mN: G groups, N micro")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2048, help="examples per rank per step")
    parser.add_argument("--groups", default="1,2,4,auto")
    parser.add_argument("--micro", default="1,2,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile-steps", type=int, default=4)
    parser.add_argument("--out-dir", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = _worker(args)
        with open(os.path.join(args.out, f"overlap_{result['ranks']}_{result['rank']}.json"), "w") as f:
            json.dump(result, f)
        return 0
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as out:
        two = _launch(args, 2, out)
        one = _launch(args, 1, out)
    header = ("config", "groups", "steps/s 2r", "best", "overlap", "exchange ms", "steps/s 1r")
    print("{:10} {:>6} {:>10} {:>6} {:>8} {:>12} {:>10}".format(*header))
    for r2, r1 in zip(two[0]["results"], one[0]["results"]):
        share = r2["trace"]["overlap_share"]
        print(
            f"{r2['config']:10} {r2['groups']:6d} {r2['steps_per_s']:10.2f} {1 / min(r2['step_s']):6.2f} "
            f"{100 * share if share is not None else float('nan'):7.1f}% {1e3 * r2['trace']['exchange_seconds']:12.1f} "
            f"{r1['steps_per_s']:10.2f}"
        )
    os.makedirs(args.out_dir, exist_ok=True)
    summary = {
        "config": {k: v for k, v in vars(args).items() if k not in ("worker", "out", "ranks")},
        "cpu_count": os.cpu_count(),
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "two_ranks": two,
        "one_rank": one[0],
    }
    with open(os.path.join(args.out_dir, "bench_interleave_overlap.json"), "w") as f:
        json.dump(summary, f, indent=1)
    note = _chart(two, os.path.join(args.out_dir, "bench_interleave_overlap.png"))
    if note:
        print(note)
    print(json.dumps({k: summary[k] for k in ("config", "load_avg_before", "load_avg_after")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
