"""Wide & Deep with Keras on Parquet input: plain vs ``htf.keras.optimize``, loss, AUC and examples/s.

A Criteo-format text file is converted to Parquet with ``hybridtf.data.convert_text`` (categorical
strings hashed into ``--buckets`` ids, 0 = missing), read back with ``hybridtf.data.parquet_dataset``
and fed to the plain Keras Wide & Deep model of ``hybridtf.models`` (embedding vocabularies
= the feature spec's id-space sizes). The same model is built twice with the same seed (identical
initial weights, checked) and trained on identical batches: once as it is, once wrapped with
``htf.keras.optimize``. Dense counts are fed as ``log(1 + max(x, 0))``.

    python examples/wdl_keras_parquet.py                       # generated Criteo-like data (20,000 rows)
    python examples/wdl_keras_parquet.py --data ../shared/data/criteo_sample.txt --batch 32 --epochs 3
    python examples/wdl_keras_parquet.py --data day_0.parquet  # a file written by the converter

``--data`` takes a Criteo text file (``label, I1..I13, C1..C26``: tab-separated without header, or
comma-separated with a header) or a Parquet file written by ``python -m hybridtf.data convert``
(its stored feature spec gives the columns and vocabularies; ``--buckets`` is then ignored). Without
``--data`` a schema-faithful synthetic Criteo text file (Zipf-skewed hex categoricals, heavy-tailed
counts, Criteo's missing-value rates, labels from a fixed random logistic model) is written to a
temporary directory first.

The last ``--eval-fraction`` of the rows is held out: the printed "held-out" loss and AUC come from
``model.evaluate`` on those rows after training; "train" loss and AUC are Keras' running values over
the last epoch. AUC is ``tf.keras.metrics.AUC`` (200 thresholds). Examples/s counts the training
steps after the first of each epoch (the first includes tracing), Parquet reading included; on a
file of a few batches (the 200-row sample) it is mostly overhead. It needs at least 2 steps per
epoch (training rows > ``--batch``); with one, the example says so instead of printing a rate.

The helpers (``write_criteo_text``, ``prepare_parquet``, ``split_parquet``, ``fields_from_spec``,
``make_dataset``, ``compare``) are also used by ``examples/din_multihot.py`` and
``tests/integration/test_parquet_training.py``.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # hybridtf of the checkout when not installed
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # example_args.py (command-line checks)

import numpy as np
import tensorflow as tf
from example_args import existing_file, fraction, int_at_least, non_negative_int, positive_float, positive_int

import hybridtf as htf
from hybridtf import models
from hybridtf._src.data.synthetic import zipf_ids

# Share of empty cells per column in Criteo (I1..I13, C1..C26), rounded from the public data.
CRITEO_MISSING_DENSE = (0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22)
CRITEO_MISSING_CAT = (0, 0, 0.03, 0.03, 0, 0.12, 0, 0, 0, 0, 0, 0.03, 0, 0, 0, 0.03, 0, 0, 0.44, 0.44, 0.03, 0.76, 0,
                      0.03, 0.44, 0.44)  # fmt: skip
_DENSE_SCALE = (1.0, 2.0, 1.5, 1.2, 4.0, 2.0, 1.5, 1.5, 2.0, 0.4, 0.8, 0.8, 1.5)  # log-scale of the counts


def _hex_ids(ranks: np.ndarray, column: int) -> np.ndarray:
    """Zipf ranks -> 8-hex-digit strings as in Criteo (a bijection of 32-bit values per column)."""
    vals = (ranks.astype(np.uint64) * np.uint64(0x9E3779B1) + np.uint64(column * 0x7F4A7C15 + 1)) & np.uint64(
        0xFFFFFFFF
    )
    return np.char.mod("%08x", vals)


def write_criteo_text(path: str | os.PathLike, rows: int, seed: int = 0) -> str:
    """Writes a synthetic Criteo-format CSV (header ``label,I1..I13,C1..C26``, empty cells = missing).

    Categoricals are Zipf-distributed over Criteo's published cardinalities (capped at 100,000) and
    written as 8-digit hex strings; counts are heavy-tailed integers (I2 may be -1); missing rates
    follow Criteo. Labels (about 25% positive) come from a fixed random logistic model on the
    categorical ranks and the log counts, so a model can learn them.

    Args:
        path: the file to write.
        rows: number of examples.
        seed: data seed (the logistic model behind the labels is fixed).

    Returns:
        ``path`` as a string.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xC417E0]))
    true = np.random.default_rng(0x7E11)  # the fixed "true model"
    cells = []
    logit = np.full(rows, -1.6)
    for j, scale in enumerate(_DENSE_SCALE):
        log_count = rng.exponential(scale, rows)
        count = np.floor(np.expm1(log_count)).astype(np.int64) - (j == 1)
        present = rng.random(rows) >= CRITEO_MISSING_DENSE[j]
        logit += present * true.normal(0, 0.6) * (np.log1p(np.maximum(count, 0)) - scale) / scale
        cells.append(np.where(present, count.astype(str), ""))
    cat_logit = np.zeros(rows)
    for j, card in enumerate(models.CRITEO_CARDINALITIES):
        ranks = zipf_ids(rows, min(card, 100_000), alpha=1.1, seed=int(rng.integers(2**31)), scatter=False)
        present = rng.random(rows) >= CRITEO_MISSING_CAT[j]
        cat_logit += present * true.normal(0, 1.0, 256)[ranks % 256]
        cells.append(np.where(present, _hex_ids(ranks, j), ""))
    logit += 1.5 * cat_logit / np.sqrt(len(models.CRITEO_CARDINALITIES))
    labels = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int64).astype(str)
    header = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
    table = np.stack([labels, *cells], axis=1)
    with open(path, "w") as f:
        f.write(",".join(header) + "\n")
        f.writelines(",".join(row) + "\n" for row in table)
    return os.fspath(path)


def prepare_parquet(
    data: str | None,
    workdir: str,
    text_format: str,
    buckets: int,
    synthesize: Callable[[str], object],
) -> tuple[str, htf.data.FeatureSpec, str]:
    """A Parquet file and its feature spec from ``data`` (text or Parquet), or from generated text.

    Args:
        data: a text file in ``text_format``, a Parquet file written by the converter, or None
            (``synthesize(text_path)`` writes the text first).
        workdir: where generated and converted files go.
        text_format: ``"criteo"``, ``"avazu"`` or ``"alimama"``.
        buckets: id space of every categorical column when converting text.
        synthesize: writes a synthetic text file in ``text_format`` to the given path.

    Returns:
        ``(parquet path, spec, description of the source)``.
    """
    if data is not None and data.endswith(".parquet"):
        return data, htf.data.read_feature_spec(data), data
    source = data
    if data is None:
        data = os.path.join(workdir, f"synthetic_{text_format}.txt")
        synthesize(data)
        source = f"generated {text_format}-format text ({data})"
    out = os.path.join(workdir, f"{text_format}.parquet")
    start = time.perf_counter()
    spec, rows = htf.data.convert_text(data, out, text_format, buckets=buckets)
    print(f"converted {rows:,} rows to Parquet in {time.perf_counter() - start:.1f}s (ids in [0, {buckets:,}))")
    return out, spec, source


def split_parquet(path: str, workdir: str, eval_fraction: float) -> tuple[str, str, int, int]:
    """Splits a Parquet file into its first rows (train) and its last ``eval_fraction`` (held out).

    The schema, with the stored feature spec, is kept. With ``eval_fraction == 0`` both paths are
    the training file (evaluation on the training data): ``path`` itself if it has no binary
    (multi-hot) columns.

    Workaround: tensorflow-io 0.36 returns wrong bytes for a binary column when one read spans
    several PLAIN-encoded data pages (pyarrow falls back from dictionary to PLAIN encoding once a
    column chunk's dictionary passes 1 MiB, e.g. after ~6,000 Alimama rows), so multi-hot ids come
    back corrupted, silently when they stay in range. The files written here keep every page
    dictionary-encoded (``dictionary_pagesize_limit``), which tensorflow-io reads correctly.

    Returns:
        ``(train path, eval path, train rows, eval rows)``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    n_eval = round(table.num_rows * eval_fraction)
    if n_eval >= table.num_rows:
        raise ValueError(f"eval_fraction {eval_fraction} leaves no training rows of {table.num_rows}.")
    binary = any(pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type) for f in table.schema)
    if n_eval == 0 and not binary:
        return path, path, table.num_rows, table.num_rows
    n_train = table.num_rows - n_eval
    parts = [("train", table.slice(0, n_train))] + ([("eval", table.slice(n_train))] if n_eval else [])
    paths = []
    for name, part in parts:
        paths.append(os.path.join(workdir, f"{name}.parquet"))
        pq.write_table(part, paths[-1], row_group_size=65536, compression="lz4", dictionary_pagesize_limit=1 << 30)
    if not n_eval:
        return paths[0], paths[0], n_train, n_train
    return paths[0], paths[1], n_train, n_eval


def describe_split(spec: htf.data.FeatureSpec, train_path: str, eval_path: str) -> tuple[str, str]:
    """Short descriptions of the training and evaluation rows: counts and clicks (label > 0)."""
    import pyarrow.parquet as pq

    def clicks(path):
        labels = pq.read_table(path, columns=[spec.label]).column(0).to_numpy()
        return len(labels), int((labels > 0).sum())

    n, pos = clicks(train_path)
    train = f"{n:,} training rows ({pos:,} clicks)"
    if eval_path == train_path:
        return train, "the training data"
    n, pos = clicks(eval_path)
    one_class = "; one class only: AUC undefined, Keras reports 0" if pos in (0, n) else ""
    return train, f"the last {n:,} rows, held out ({pos:,} clicks{one_class})"


def fields_from_spec(spec: htf.data.FeatureSpec, dim: int) -> list[models.FieldSpec]:
    """One ``FieldSpec`` per id column of ``spec``; vocabulary = the column's id space (buckets)."""
    missing = [c for c in (*spec.one_hot, *spec.multi_hot) if c not in spec.buckets]
    if missing:
        raise ValueError(f"the feature spec has no id-space size (buckets) for {missing}.")
    fields = [models.FieldSpec(c, vocab=spec.buckets[c], dim=dim) for c in spec.one_hot]
    fields += [models.FieldSpec(c, vocab=spec.buckets[c], dim=dim, kind=models.MULTI_HOT) for c in spec.multi_hot]
    return fields


def make_dataset(path: str, spec: htf.data.FeatureSpec, batch_size: int, shuffle: bool, seed: int) -> tf.data.Dataset:
    """``parquet_dataset`` with dense values as ``log(1 + max(x, 0))`` and labels as ``[B, 1]``."""

    def prepare(features, labels):
        if models.DENSE_KEY in features:
            features = {**features, models.DENSE_KEY: tf.math.log1p(tf.maximum(features[models.DENSE_KEY], 0.0))}
        return features, labels[:, None]

    ds = htf.data.parquet_dataset(path, spec=spec, batch_size=batch_size, shuffle=shuffle, seed=seed, rank=0, size=1)
    return ds.map(prepare)


class BatchLoss(tf.keras.metrics.Metric):
    """The binary cross-entropy of the last batch (Keras' ``loss`` log is a running mean)."""

    def __init__(self, name="batch_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.value = self.add_weight(name="value", initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = tf.reshape(tf.cast(y_true, y_pred.dtype), tf.shape(y_pred))
        self.value.assign(tf.reduce_mean(tf.keras.losses.binary_crossentropy(y_true, y_pred)))

    def result(self):
        return self.value

    def reset_state(self):
        self.value.assign(0.0)


class StepLog(tf.keras.callbacks.Callback):
    """Per-step losses and, per epoch, the wall-clock time at the end of every step."""

    def __init__(self):
        super().__init__()
        self.losses, self.times = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.times.append([])

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["batch_loss"]))
        self.times[-1].append(time.perf_counter())


def train_and_evaluate(model, train_ds, eval_ds, *, epochs: int, lr: float, train_rows: int, batch_size: int) -> dict:
    """Compiles ``model`` (Adagrad, binary cross-entropy, AUC), fits ``epochs`` epochs, evaluates.

    Returns:
        ``step_losses`` (per training step), ``train_loss`` / ``train_auc`` (running over the last
        epoch), ``eval_loss`` / ``eval_auc`` (``model.evaluate`` on ``eval_ds``), ``examples_per_s``
        (steps after the first of each epoch; None with one step per epoch: nothing timed), ``timed_steps``
        and ``seconds`` (the whole fit).
    """
    model.compile(
        optimizer=tf.keras.optimizers.Adagrad(lr),
        loss="binary_crossentropy",
        metrics=[tf.keras.metrics.AUC(name="auc"), BatchLoss()],
    )
    log = StepLog()
    start = time.perf_counter()
    history = model.fit(train_ds, epochs=epochs, verbose=0, callbacks=[log])
    seconds = time.perf_counter() - start
    evaluation = model.evaluate(eval_ds, verbose=0, return_dict=True)
    # Steady state: the steps after the first of each epoch (the first includes tracing / iterator start).
    timed_examples = epochs * (train_rows - min(batch_size, train_rows))
    timed_seconds = sum(t[-1] - t[0] for t in log.times if t)
    timed_steps = sum(max(len(t) - 1, 0) for t in log.times)
    return {
        "step_losses": np.array(log.losses),
        "train_loss": history.history["loss"][-1],
        "train_auc": history.history["auc"][-1],
        "eval_loss": evaluation["loss"],
        "eval_auc": evaluation["auc"],
        "examples_per_s": timed_examples / timed_seconds if timed_steps and timed_seconds > 0 else None,
        "timed_steps": timed_steps,
        "seconds": seconds,
    }


def compare(build: Callable[[], tf.keras.Model], make_train_ds, make_eval_ds, **train_args) -> dict:
    """Trains ``build()`` as it is and wrapped with ``htf.keras.optimize``, from the same weights.

    ``build`` must be deterministic (same seed: same initial weights; checked). Each model gets a
    fresh ``make_train_ds()`` / ``make_eval_ds()`` (same seeds: same batches).

    Returns:
        ``{"plain": results, "hybridtf": results, "tables": n, "packed_tables": n, "skipped": [...]}``
        with ``results`` as from :func:`train_and_evaluate`.
    """
    out = {}
    plain = build()
    initial = plain.get_weights()
    out["plain"] = train_and_evaluate(plain, make_train_ds(), make_eval_ds(), **train_args)
    model = build()
    if not all(np.array_equal(a, b) for a, b in zip(initial, model.get_weights())):
        raise AssertionError("the two builds have different initial weights; build() must be seeded.")
    model = htf.keras.optimize(model)
    plan = model.hybridtf_plan
    out.update(tables=len(plan.tables), packed_tables=len(plan.packed_tables), skipped=list(model.hybridtf_skipped))
    out["hybridtf"] = train_and_evaluate(model, make_train_ds(), make_eval_ds(), **train_args)
    return out


def print_comparison(result: dict, eval_desc: str, *, train_rows: int, batch_size: int) -> None:
    """Prints per model: final loss, AUC, examples/s; then the differences."""
    plain, fast = result["plain"], result["hybridtf"]
    timed = plain["examples_per_s"] is not None and fast["examples_per_s"] is not None
    print(
        f"hybridtf plan: {result['tables']} embedding tables -> {result['packed_tables']} packed tables"
        + (f", skipped: {result['skipped']}" if result["skipped"] else "")
    )
    print(f"{'':9} {'train loss':>10} {'train AUC':>10} {'eval loss':>10} {'eval AUC':>10} {'examples/s':>11}")
    for name, r in (("plain", plain), ("hybridtf", fast)):
        print(
            f"{name:9} {r['train_loss']:10.6f} {r['train_auc']:10.6f} {r['eval_loss']:10.6f} {r['eval_auc']:10.6f} "
            + (f"{r['examples_per_s']:11,.0f}" if r["examples_per_s"] is not None else f"{'n/a':>11}")
        )
    rel = np.abs(fast["step_losses"] - plain["step_losses"]) / np.abs(plain["step_losses"])
    print(f"(train: running over the last epoch; eval: model.evaluate on {eval_desc})")
    print(
        f"hybridtf - plain: train loss {fast['train_loss'] - plain['train_loss']:+.2e}, "
        f"train AUC {fast['train_auc'] - plain['train_auc']:+.2e}, "
        f"eval loss {fast['eval_loss'] - plain['eval_loss']:+.2e}, "
        f"eval AUC {fast['eval_auc'] - plain['eval_auc']:+.2e}; per-step losses ({len(rel)} steps): "
        f"max relative difference {rel.max():.2e}"
    )
    if timed:
        print(
            f"throughput hybridtf / plain: {fast['examples_per_s'] / plain['examples_per_s']:.2f}x "
            f"(examples/s over {plain['timed_steps']} timed steps: the steps after the first of each epoch)"
        )
    else:
        smaller_batch = f"--batch {train_rows // 2:,} or less, or " if train_rows >= 2 else ""
        print(
            f"throughput: not measured: it is timed over the steps after the first of each epoch, and "
            f"{train_rows:,} training rows at batch {batch_size:,} make 1 step per epoch. For at least 2 steps "
            f"per epoch use {smaller_batch}more rows (--rows, or a larger --data)."
        )


def example_parser(doc: str, data_format: str, *, batch: int, epochs: int, lr: float, dim_help: str):
    """The command line the data examples share (data path, generated rows, training settings).

    Bad values (a missing file, ``--epochs 0``, ``--eval-fraction 1.5``, ...) are usage errors.
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument(
        "--data",
        type=existing_file,
        help=f"{data_format} text file or converted Parquet file (default: generated data)",
    )
    parser.add_argument("--rows", type=positive_int, default=20_000, help="rows of generated data")
    parser.add_argument(
        "--buckets", type=int_at_least(2), default=2**16, help="id space per categorical column (text input)"
    )
    parser.add_argument("--batch", type=positive_int, default=batch)
    parser.add_argument("--epochs", type=positive_int, default=epochs)
    parser.add_argument("--dim", type=positive_int, default=16, help=dim_help)
    parser.add_argument("--lr", type=positive_float, default=lr, help="Adagrad learning rate")
    parser.add_argument(
        "--eval-fraction",
        type=fraction,
        default=0.2,
        help="share of the rows held out, the last ones (0: eval on train)",
    )
    parser.add_argument("--no-shuffle", action="store_true", help="read the training rows in file order")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    return parser


def prepare_or_exit(parser: argparse.ArgumentParser, args, workdir: str, text_format: str, synthesize):
    """:func:`prepare_parquet` and :func:`split_parquet`; a file they cannot use is a usage error.

    Returns:
        ``(spec, source, train path, eval path, train rows)``.
    """
    try:
        path, spec, source = prepare_parquet(args.data, workdir, text_format, args.buckets, synthesize)
    except htf.data.DataError as e:  # e.g. "... lacks the criteo columns [...]; is this criteo data?"
        parser.error(f"--data: {e}")
    try:
        train_path, eval_path, n_train, _ = split_parquet(path, workdir, args.eval_fraction)
    except ValueError as e:  # too few rows to hold out that share
        parser.error(f"--eval-fraction {args.eval_fraction}: {e}")
    return spec, source, train_path, eval_path, n_train


def main():
    parser = example_parser(
        __doc__, "Criteo", batch=512, epochs=1, lr=0.05, dim_help="embedding width of the deep part"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="wdl_parquet_") as workdir:
        spec, source, train_path, eval_path, n_train = prepare_or_exit(
            parser, args, workdir, "criteo", lambda p: write_criteo_text(p, args.rows, args.seed)
        )
        train_desc, eval_desc = describe_split(spec, train_path, eval_path)
        fields = fields_from_spec(spec, args.dim)
        n_dense = len(spec.dense)
        print(
            f"data: {source}: {train_desc}, {len(spec.dense)} dense + {len(fields)} categorical "
            f"columns (vocab {min(f.vocab for f in fields):,}-{max(f.vocab for f in fields):,})"
        )
        print(f"Wide & Deep, dim {args.dim}, batch {args.batch}, {args.epochs} epoch(s), Adagrad({args.lr})")
        result = compare(
            lambda: models.wide_and_deep(fields, n_dense, hidden=(128, 64), seed=args.seed),
            lambda: make_dataset(train_path, spec, args.batch, not args.no_shuffle, args.seed),
            lambda: make_dataset(eval_path, spec, args.batch, False, None),
            epochs=args.epochs,
            lr=args.lr,
            train_rows=n_train,
            batch_size=args.batch,
        )
        print_comparison(result, eval_desc, train_rows=n_train, batch_size=args.batch)


if __name__ == "__main__":
    main()
