"""Cost of a HybridHash flush against the table's size: the touched-only path vs a pass over every row.

Fills two real stores (``hybridtf.native.HybridHashStore``, one thread) with N
distinct random int64 ids and a small hot tier, then runs rounds of Zipf
lookups over a fixed set of ids followed by a flush, and times the flushes:

* ``touched_only``: the default store (``count_decay=1``, no TTL). Its flush
  compares only the hot rows and the rows looked up since the last flush
  (see ``kernels/hybrid_hash/hybrid_hash_flush_impl.cc``);
* ``full_pass``: the same stream through a store with a TTL no row reaches,
  whose flush passes over every stored row (what every flush did before).

Both keep the same top-k (``tests/ops/test_native_bindings.py`` checks it).
Prints a table, one JSON line, and writes JSON + PNG to ``--out-dir``.

    python benchmarks/bench_hybrid_hash_flush.py [--sizes 1000000 3000000 8000000] [--hot-rows 40000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from hybridtf import native

REPO = Path(__file__).resolve().parent.parent


def measure(n, hot_rows, touched, rounds, dim, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(-(2**62), 2**62, size=n, dtype=np.int64)
    kw = dict(dim=dim, hot_rows=hot_rows, warmup_steps=0, flush_every=10**9)
    stores = {"touched_only": native.HybridHashStore("flush", **kw)}
    stores["full_pass"] = native.HybridHashStore("flush", ttl_steps=2**31 - 1, **kw)
    grad = np.zeros((min(n, 1 << 20), dim), np.float32)
    for s in stores.values():
        for start in range(0, n, 1 << 20):
            chunk = ids[start : start + (1 << 20)]
            s.lookup(chunk)
            s.apply_adagrad(chunk, grad[: len(chunk)], 0.1)
        s.end_step()  # step 0: the first flush (a pass over every row in both)
    # The traffic between flushes: a Zipf(1.05) sample of `touched` distinct ids, with counts.
    pool = rng.choice(ids, size=touched, replace=False)
    weights = 1.0 / np.arange(1, touched + 1) ** 1.05
    times = {k: [] for k in stores}
    candidates = {}
    for _ in range(rounds):
        counts = rng.multinomial(20 * touched, weights / weights.sum()).astype(np.int64)
        for name, s in stores.items():
            s.lookup(pool, counts)
            start = time.perf_counter()
            s.flush()
            times[name].append((time.perf_counter() - start) * 1e3)
            candidates[name] = s.last_flush_candidates()
    return {
        "rows": n,
        "hot_rows": hot_rows,
        "touched_per_flush": touched,
        **{f"{k}_ms": statistics.median(v) for k, v in times.items()},
        **{f"{k}_candidates": v for k, v in candidates.items()},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 3_000_000, 8_000_000])
    parser.add_argument("--hot-rows", type=int, default=40_000)
    parser.add_argument("--touched", type=int, default=100_000, help="distinct ids looked up between flushes")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    results = []
    for n in args.sizes:
        r = measure(n, args.hot_rows, min(args.touched, n), args.rounds, args.dim)
        results.append(r)
        print(
            f"{n:>10d} rows, {args.hot_rows} hot: flush touched-only {r['touched_only_ms']:7.2f} ms "
            f"({r['touched_only_candidates']} rows compared), full pass {r['full_pass_ms']:7.2f} ms "
            f"({r['full_pass_candidates']} rows)",
            flush=True,
        )
    payload = {
        "benchmark": "hybrid_hash_flush",
        "args": {k: str(v) for k, v in vars(args).items()},
        "results": results,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out_dir / f"bench_hybrid_hash_flush-{stamp}.json").write_text(json.dumps(payload, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        x = [r["rows"] for r in results]
        ax.plot(x, [r["touched_only_ms"] for r in results], marker="o", label="touched-only flush")
        ax.plot(x, [r["full_pass_ms"] for r in results], marker="o", label="pass over every row")
        ax.set_xscale("log")
        ax.set_xlabel("rows stored")
        ax.set_ylabel(f"flush time, ms (one thread, {args.hot_rows} hot rows)")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.out_dir / f"bench_hybrid_hash_flush-{stamp}.png", dpi=110)
    except ImportError:
        print("matplotlib is not installed: no chart")
    print(json.dumps(payload))


if __name__ == "__main__":
    main()
