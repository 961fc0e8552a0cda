"""Bytes per stored row of a HybridHash table against its rows + optimizer slots alone.

Fills the real store (``hybridtf.native.HybridHashStore``) with N distinct
random int64 ids, gives them optimizer slots through one update, and divides
the store's bytes (cold tier: arena chunks + hash map + free list; hot tier
separately) by N. The payload is ``(1 + slots) * dim * 4`` bytes (fp32).
Prints a table, one JSON line, and writes JSON + PNG to ``--out-dir``.

    python benchmarks/bench_hybrid_hash_memory.py [--dim 16] [--optimizer adagrad]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from hybridtf import native

REPO = Path(__file__).resolve().parent.parent
SLOTS = {"sgd": 0, "adagrad": 1, "adam": 2}


def measure(n, dim, optimizer, hot_fraction, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.unique(rng.integers(-(2**62), 2**62, size=n, dtype=np.int64))
    store = native.HybridHashStore("mem", dim=dim, hot_rows=max(1, int(hot_fraction * len(ids))), warmup_steps=0)
    grad = np.zeros((len(ids), dim), np.float32)
    store.lookup(ids)
    if optimizer == "adagrad":
        store.apply_adagrad(ids, grad, 0.1)
    elif optimizer == "adam":
        store.apply_adam(ids, grad, 0.001, 0.1, 0.001, 1e-7)
    else:
        store.apply_sgd(ids, grad, 0.1)
    store.end_step()  # step 0 >= warmup 0: the hot tier is filled
    s = store.stats()
    payload = (1 + SLOTS[optimizer]) * dim * 4
    return {
        "rows": s["size"],
        "payload_bytes_per_row": payload,
        "cold_bytes_per_row": s["bytes"] / s["size"],
        "cold_ratio": s["bytes"] / s["size"] / payload,
        "hot_rows": s["hot_used"],
        "with_hot_ratio": (s["bytes"] + s["hot_bytes"]) / s["size"] / payload,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--optimizer", choices=sorted(SLOTS), default="adagrad")
    parser.add_argument("--hot-fraction", type=float, default=0.1)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 300_000, 1_000_000])
    parser.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    results = []
    for n in args.sizes:
        r = measure(n, args.dim, args.optimizer, args.hot_fraction)
        results.append(r)
        print(
            f"{r['rows']:>9d} rows: {r['cold_bytes_per_row']:.1f} B/row cold = {r['cold_ratio']:.3f}x of "
            f"{r['payload_bytes_per_row']} B (rows + slots); with a {args.hot_fraction:.0%} hot tier "
            f"{r['with_hot_ratio']:.3f}x",
            flush=True,
        )
    payload = {
        "benchmark": "hybrid_hash_memory",
        "args": {k: str(v) for k, v in vars(args).items()},
        "max_cold_ratio": max(r["cold_ratio"] for r in results),
        "results": results,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out_dir / f"bench_hybrid_hash_memory-{stamp}.json").write_text(json.dumps(payload, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        x = [r["rows"] for r in results]
        ax.plot(x, [r["cold_ratio"] for r in results], marker="o", label="cold tier (map + arena)")
        ax.plot(x, [r["with_hot_ratio"] for r in results], marker="o", label=f"+ {args.hot_fraction:.0%} hot tier")
        ax.axhline(1.3, color="gray", ls="--", label="1.3x target")
        ax.set_xscale("log")
        ax.set_xlabel("rows stored")
        ax.set_ylabel(f"bytes per row / rows+slots (dim {args.dim}, {args.optimizer})")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.out_dir / f"bench_hybrid_hash_memory-{stamp}.png", dpi=110)
    except ImportError:
        print("matplotlib is not installed: no chart")
    print(json.dumps(payload))


if __name__ == "__main__":
    main()
