"""The dynamic-table section of ``hybridtf.report``: HybridHash statistics after a few training steps.

``dynamic_tables(obj)`` reads the metrics (``caching.stats.summarize``: hot-tier
hit ratio of the last step and cumulative, size, hot rows used, inserts,
evictions, flushes, bytes) of every dynamic table of a Keras model
(``DynamicEmbedding`` layers), a ``hybridtf.embedding.Tables`` set or a
single layer / table. ``dynamic_section`` trains a small model with two
``DynamicEmbedding`` fields on Zipf-distributed raw 64-bit ids for a few
steps and returns its ``DynamicSection``, which prints as a table; this is
what ``python -m hybridtf.report --dynamic`` shows.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import tensorflow as tf

from hybridtf._src.caching.stats import summarize

_COLUMNS = (
    ("table", "{name}"),
    ("rows", "{size:,}"),
    ("hot used/rows", "{hot_used:,}/{hot_rows:,}"),
    ("hit ratio (last step)", "{hit_ratio:.3f}"),
    ("hit ratio (cumulative)", "{hit_ratio_cumulative:.3f}"),
    ("inserts", "{inserts:,}"),
    ("evictions", "{evictions:,}"),
    ("flushes", "{flushes:,}"),
    ("bytes/row", "{bytes_per_row_cell}"),
)
# bytes/row is shown from this many rows on: the store allocates its rows in chunks of 1,024 records,
# so a table of a few rows would show a chunk's bytes over those rows.
BYTES_PER_ROW_MIN_ROWS = 8192


def bytes_per_row_text(metrics: dict) -> str:
    """``"<n> bytes/row"``, or the table's bytes when it holds too few rows for a per-row figure."""
    if metrics.get("bytes_per_row") is None:
        return f"{metrics['bytes']:,} bytes (per row from {BYTES_PER_ROW_MIN_ROWS:,} rows)"
    return f"{metrics['bytes_per_row']:.0f} bytes/row"


def _owners(obj) -> list:
    from hybridtf._src.caching.dynamic_table import DynamicTable
    from hybridtf._src.caching.layer import DynamicEmbedding
    from hybridtf._src.capture.lookup_api import Tables

    if isinstance(obj, (DynamicEmbedding, DynamicTable)):
        return [obj] if getattr(obj, "table", None) is not None else []
    if isinstance(obj, Tables):
        return list(obj.dynamic_tables.values())
    if isinstance(obj, tf.Module):
        return [m for m in obj.submodules if isinstance(m, DynamicEmbedding) and m.table is not None]
    raise TypeError(
        f"dynamic_tables takes a Keras model or layer, a hybridtf.embedding.Tables or a DynamicEmbedding, got "
        f"{type(obj).__name__}."
    )


def dynamic_tables(obj) -> dict:
    """``{table name: metrics}`` of every built dynamic table of ``obj`` (eager).

    Args:
        obj: a Keras model (its ``DynamicEmbedding`` layers, nested ones too),
            a ``hybridtf.embedding.Tables``, or one ``DynamicEmbedding``.

    Returns:
        For each table, ``caching.stats.summarize`` of its statistics plus
        ``bytes_per_row`` (None under ``BYTES_PER_ROW_MIN_ROWS`` rows).

    Raises:
        TypeError: ``obj`` holds no dynamic tables of a known kind.

    Example:
        >>> dynamic_tables(model)["user"]["hit_ratio_cumulative"]
        0.84
    """
    found = {}
    for owner in _owners(obj):
        metrics = summarize(owner.table.stats())
        size = metrics["size"]
        metrics["bytes_per_row"] = metrics["bytes"] / size if size >= BYTES_PER_ROW_MIN_ROWS else None
        found[owner.table.name] = metrics
    return found


@dataclasses.dataclass
class DynamicSection:
    """The dynamic-table section: what ran and each table's metrics.

    Attributes:
        steps: training steps run.
        batch: examples per step.
        seconds: wall time of the steps (first step's tracing included).
        tables: ``{table name: metrics}`` (see ``dynamic_tables``).
    """

    steps: int
    batch: int
    seconds: float
    tables: dict

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        rows = [[title for title, _ in _COLUMNS]]
        for name, m in self.tables.items():
            cell = "-" if m["bytes_per_row"] is None else f"{m['bytes_per_row']:.0f}"
            rows.append([fmt.format(name=name, bytes_per_row_cell=cell, **m) for _, fmt in _COLUMNS])
        widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
        lines = [
            f"dynamic tables (HybridHash) of the demo model (two DynamicEmbedding fields, raw 64-bit Zipf ids): "
            f"{self.steps} training steps of batch {self.batch} in {self.seconds:.1f} s",
        ]
        for i, r in enumerate(rows):
            lines.append(
                "  " + "  ".join(c.rjust(w) if i and j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths)))
            )
        lines.append(
            "  hit ratio: distinct ids of a step served by the hot tier (0 during warm-up); Algorithm 1 refills "
            "the hot tier with the top-k ids by frequency every flush_every steps."
        )
        lines.append(
            f"  bytes/row: the store's bytes over its rows ('-' under {BYTES_PER_ROW_MIN_ROWS:,} rows, where "
            "its chunked allocation dominates)."
        )
        return "\n".join(lines)


def _zipf_hashed_ids(rng, vocab: int, size: int) -> np.ndarray:
    """Zipf(1.05) ranks mapped to raw 64-bit ids (an odd multiplier: distinct ranks give distinct ids)."""
    p = 1.0 / np.arange(1, vocab + 1) ** 1.05
    ranks = rng.choice(vocab, size=size, p=p / p.sum()).astype(np.uint64)
    return ((ranks + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15) >> np.uint64(1)).astype(np.int64)


def dynamic_section(steps: int = 30, batch: int = 256, dim: int = 16, vocab: int = 20_000, seed: int = 0):
    """Trains a two-field model with ``DynamicEmbedding`` tables for ``steps`` steps; returns its section.

    The ids are raw 64-bit hashes of Zipf(1.05) ranks (no bucketing); each
    table's hot tier holds 5% of ``vocab`` rows, warm-up 5 steps, a flush
    every 5 steps, Adagrad through ``dynamic_optimizer``.

    Example:
        >>> print(dynamic_section(steps=20))
    """
    from hybridtf._src.caching.layer import DynamicEmbedding
    from hybridtf._src.caching.optimizer import dynamic_optimizer

    if steps <= 0 or batch <= 0:
        raise ValueError(f"dynamic_section needs steps > 0 and batch > 0, got {steps} and {batch}.")
    rng = np.random.default_rng(seed)
    n = steps * batch
    x = {f: _zipf_hashed_ids(rng, vocab, n) for f in ("user", "item")}
    y = (rng.random((n, 1)) < 0.3).astype(np.float32)
    hot = max(1, vocab // 20)
    inputs = {f: tf.keras.Input((), dtype=tf.int64, name=f) for f in x}
    parts = [DynamicEmbedding(dim, hot_rows=hot, warmup_steps=5, flush_every=5, name=f"{f}_hash")(inputs[f]) for f in x]
    out = tf.keras.layers.Dense(1, activation="sigmoid")(tf.concat(parts, axis=1))
    model = tf.keras.Model(inputs, out)
    model.compile(optimizer=dynamic_optimizer(tf.keras.optimizers.Adagrad(0.05)), loss="binary_crossentropy")
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return DynamicSection(steps, batch, time.perf_counter() - start, dynamic_tables(model))
