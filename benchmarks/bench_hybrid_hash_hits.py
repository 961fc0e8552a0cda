"""Hit ratio of HybridHash's Algorithm 1 vs offline-optimal static top-k, LRU and LFU (PICASSO Table VI style).

A stream of batches of Zipf ids (with or without drift: the popular ids move
over time) is fed to the real TF-free HybridHash store through the NumPy
binding (``hybridtf.native.HybridHashStore``: lookup of each batch's distinct
ids with their counts, then the step's end, where Algorithm 1 flushes). At the
same hot capacity k (1% .. 50% of the distinct ids) it is compared with

* offline-optimal static top-k: the k ids with most occurrences over the
  measured steps, chosen knowing the whole stream (the best any static hot set
  can do; Algorithm 1 is a static set between flushes);
* LRU and LFU caches of k ids, updated on every distinct id of every batch.

Hit ratios are over the steps after warm-up, weighted by occurrences (the
fraction of id lookups served by the hot tier) and over distinct ids per batch
(PICASSO's "unique IDs' hit ratio"). Prints a table, one JSON line, and writes
JSON + PNG to ``--out-dir``.

    python benchmarks/bench_hybrid_hash_hits.py [--ids 20000] [--steps 120] [--batch 2048]
"""

from __future__ import annotations

import argparse
import collections
import heapq
import json
import time
from pathlib import Path

import numpy as np

from hybridtf import native

REPO = Path(__file__).resolve().parent.parent
HOT_FRACTIONS = (0.01, 0.02, 0.05, 0.10, 0.20, 0.50)


def zipf_stream(n_ids, steps, batch, alpha, drift, seed=0):
    """Batches of ids: rank r ~ Zipf(alpha) mapped to id perm[(r + shift_t) % n] (shift_t grows with drift)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, n_ids + 1) ** alpha
    p /= p.sum()
    perm = rng.permutation(n_ids).astype(np.int64) * 7919 + 11  # arbitrary int64 ids
    out = []
    for t in range(steps):
        ranks = rng.choice(n_ids, size=batch, p=p)
        shift = int(drift * n_ids * t)
        out.append(perm[(ranks + shift) % n_ids])
    return out


def algorithm1(stream, k, warmup, flush_every, decay=1.0):
    store = native.HybridHashStore(
        "bench", dim=1, hot_rows=k, warmup_steps=warmup, flush_every=flush_every, count_decay=decay
    )
    base = None
    for t, batch in enumerate(stream):
        if t == warmup:
            base = store.stats()
        ids, counts = np.unique(batch, return_counts=True)
        store.lookup(ids, counts)
        store.end_step()
    s = store.stats()
    return (
        (s["occurrence_hits"] - base["occurrence_hits"]) / (s["occurrences"] - base["occurrences"]),
        (s["hits"] - base["hits"]) / (s["lookups"] - base["lookups"]),
    )


def static_optimal(stream, k, warmup):
    measured = stream[warmup:]
    occ = collections.Counter()
    batches = collections.Counter()
    for batch in measured:
        ids, counts = np.unique(batch, return_counts=True)
        occ.update(dict(zip(ids.tolist(), counts.tolist())))
        batches.update(ids.tolist())
    top_occ = {i for i, _ in occ.most_common(k)}
    top_batches = {i for i, _ in batches.most_common(k)}
    total = sum(occ.values())
    weighted = sum(c for i, c in occ.items() if i in top_occ) / total
    distinct = sum(c for i, c in batches.items() if i in top_batches) / sum(batches.values())
    return weighted, distinct


def classic_cache(stream, k, warmup, policy):
    """LRU or LFU over each batch's distinct ids (from the first step: it warms up too)."""
    lru = collections.OrderedDict()
    freq = collections.Counter()
    cache = set()
    heap = []  # LFU: (count, tick, id), stale entries skipped
    hits = occ_hits = lookups = occ = 0
    tick = 0
    for t, batch in enumerate(stream):
        ids, counts = np.unique(batch, return_counts=True)
        for i, c in zip(ids.tolist(), counts.tolist()):
            tick += 1
            hit = i in (lru if policy == "lru" else cache)
            if t >= warmup:
                lookups += 1
                occ += c
                hits += hit
                occ_hits += c * hit
            if policy == "lru":
                if hit:
                    lru.move_to_end(i)
                else:
                    lru[i] = True
                    if len(lru) > k:
                        lru.popitem(last=False)
                continue
            freq[i] += c
            if not hit:
                while len(cache) >= k:
                    cnt, _, victim = heapq.heappop(heap)
                    if victim in cache and freq[victim] == cnt:
                        cache.discard(victim)
                cache.add(i)
            heapq.heappush(heap, (freq[i], tick, i))
    return occ_hits / occ, hits / lookups


def run(args):
    results = []
    for drift_name, drift in (("no_drift", 0.0), ("drift", args.drift)):
        stream = zipf_stream(args.ids, args.steps, args.batch, args.alpha, drift)
        distinct = len(np.unique(np.concatenate(stream)))
        for frac in HOT_FRACTIONS:
            k = max(1, int(frac * distinct))
            row = {"stream": drift_name, "hot_fraction": frac, "hot_rows": k, "distinct_ids": distinct}
            row["algorithm1"] = algorithm1(stream, k, args.warmup, args.flush_every)
            row["algorithm1_decay0.5"] = algorithm1(stream, k, args.warmup, args.flush_every, 0.5)
            row["static_optimal"] = static_optimal(stream, k, args.warmup)
            row["lru"] = classic_cache(stream, k, args.warmup, "lru")
            row["lfu"] = classic_cache(stream, k, args.warmup, "lfu")
            results.append(row)
            print(
                f"{drift_name:9s} hot {frac:5.0%} k={k:6d}  "
                + "  ".join(
                    f"{name} {row[name][0]:.3f}/{row[name][1]:.3f}"
                    for name in ("algorithm1", "algorithm1_decay0.5", "static_optimal", "lru", "lfu")
                ),
                flush=True,
            )
    return results


def chart(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, stream in zip(axes, ("no_drift", "drift")):
        rows = [r for r in results if r["stream"] == stream]
        x = [100 * r["hot_fraction"] for r in rows]
        for name in ("algorithm1", "algorithm1_decay0.5", "static_optimal", "lru", "lfu"):
            ax.plot(x, [r[name][0] for r in rows], marker="o", label=name)
        ax.set_xscale("log")
        ax.set_xlabel("hot storage, % of distinct ids")
        ax.set_title(f"Zipf stream, {stream.replace('_', ' ')}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("hit ratio (id occurrences)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--alpha", type=float, default=1.05)
    parser.add_argument(
        "--drift", type=float, default=0.0005, help="fraction of the id space the hot set moves per step"
    )
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--flush-every", type=int, default=10)
    parser.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    results = run(args)
    within = {
        f"{r['hot_fraction']:.0%}": r["algorithm1"][0] / r["static_optimal"][0]
        for r in results
        if r["stream"] == "no_drift" and r["hot_fraction"] in (0.05, 0.10, 0.20)
    }
    payload = {
        "benchmark": "hybrid_hash_hits",
        "args": {k: str(v) for k, v in vars(args).items()},
        "algorithm1_over_optimal_no_drift": within,
        "results": results,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out_dir / f"bench_hybrid_hash_hits-{stamp}.json").write_text(json.dumps(payload, indent=1))
    try:
        chart(results, args.out_dir / f"bench_hybrid_hash_hits-{stamp}.png")
    except ImportError:
        print("matplotlib is not installed: no chart")
    print(json.dumps(payload))


if __name__ == "__main__":
    main()
