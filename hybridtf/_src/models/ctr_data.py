"""Synthetic, schema-faithful CTR data: field specs, numpy batches and tf.data pipelines.

A *field* is one categorical feature with its own embedding table. One-hot fields carry one id
per example; multi-hot fields (behaviour sequences, tag lists) carry 0..``max_len`` ids per
example. Ids follow a bounded Zipf law (:func:`hybridtf._src.data.synthetic.zipf_ids`), so a few
hot ids carry most lookups, as in production CTR data.

Labels depend on the ids and on the dense features through a fixed random logit (one weight per
(field, id bucket) plus a linear term on the dense features), so a model trained on this data can
learn something (AUC clearly above 0.5) and a broken model shows up as a flat loss.

Every batch is a pure function of ``(fields, n_dense, batch_size, seed, batch index)``: the same
seed gives the same batches, and a shorter run is a prefix of a longer one. The "true model" behind
the labels depends on ``label_seed`` only, not on ``seed``: streams with different seeds (train and
test splits) are samples of the same task.

Example:
    >>> fields = criteo_like_fields(dim=16, max_vocab=10_000)
    >>> ds = make_dataset(fields, n_dense=CRITEO_NUM_DENSE, batch_size=256, num_batches=10)
    >>> features, labels = next(iter(ds))
    >>> features["C1"].shape, features[DENSE_KEY].shape, labels.shape
    (TensorShape([256]), TensorShape([256, 13]), TensorShape([256, 1]))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import NamedTuple, Union

import numpy as np

from hybridtf._src.data.synthetic import zipf_ids

DENSE_KEY = "dense"
"""Feature-dict key of the float32 ``[B, n_dense]`` dense features."""

CRITEO_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
"""Published vocabulary sizes of Criteo's 26 categorical columns C1..C26 (Kaggle display-ads)."""

CRITEO_NUM_DENSE = 13
"""Number of dense (integer count) columns I1..I13 in Criteo."""

ONE_HOT = "one_hot"
MULTI_HOT = "multi_hot"
_KINDS = (ONE_HOT, MULTI_HOT)
_COMBINERS = ("sum", "mean", "sqrtn")
_LABEL_BUCKETS = 1024


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """One categorical feature field and its embedding table.

    Args:
        name: feature key and base of the layer names (``emb_<name>``); a valid Python identifier
            other than ``"dense"``.
        vocab: number of distinct ids (ids are in ``[0, vocab)``); rows of the embedding table.
        dim: embedding width.
        kind: ``"one_hot"`` (one id per example) or ``"multi_hot"`` (0..``max_len`` ids).
        max_len: longest multi-hot row (1 for one-hot fields).
        mean_len: mean multi-hot row length before clipping to ``[0, max_len]`` (Poisson).
        alpha: Zipf exponent of the ids (about 1.0-1.2 for CTR data; larger is more skewed).
        combiner: how models pool a multi-hot row: ``"sum"``, ``"mean"`` or ``"sqrtn"``.

    Raises:
        ValueError: an argument is out of range.

    Example:
        >>> FieldSpec("hist_item", vocab=50_000, dim=16, kind="multi_hot", max_len=50, mean_len=10)
    """

    name: str
    vocab: int
    dim: int = 16
    kind: str = ONE_HOT
    max_len: int = 1
    mean_len: float = 1.0
    alpha: float = 1.1
    combiner: str = "mean"

    def __post_init__(self):
        if not self.name.isidentifier() or self.name == DENSE_KEY:
            raise ValueError(f"field name must be a Python identifier other than {DENSE_KEY!r}, got {self.name!r}.")
        if self.vocab < 1 or self.dim < 1:
            raise ValueError(f"field {self.name!r}: need vocab >= 1 and dim >= 1, got {self.vocab}, {self.dim}.")
        if self.kind not in _KINDS:
            raise ValueError(f"field {self.name!r}: kind must be one of {_KINDS}, got {self.kind!r}.")
        if self.kind == ONE_HOT and self.max_len != 1:
            raise ValueError(f"field {self.name!r}: a one-hot field has max_len 1, got {self.max_len}.")
        if self.max_len < 1 or not 0 <= self.mean_len <= self.max_len:
            raise ValueError(
                f"field {self.name!r}: need max_len >= 1 and 0 <= mean_len <= max_len, "
                f"got max_len={self.max_len}, mean_len={self.mean_len}."
            )
        if self.alpha <= 0:
            raise ValueError(f"field {self.name!r}: alpha must be > 0, got {self.alpha}.")
        if self.combiner not in _COMBINERS:
            raise ValueError(f"field {self.name!r}: combiner must be one of {_COMBINERS}, got {self.combiner!r}.")

    @property
    def multi_hot(self) -> bool:
        """Whether this field carries a variable number of ids per example."""
        return self.kind == MULTI_HOT


class RaggedIds(NamedTuple):
    """A batch of multi-hot ids in numpy: row ``i`` is ``values[row_splits[i]:row_splits[i + 1]]``."""

    values: np.ndarray  # int64 [total ids]
    row_lengths: np.ndarray  # int64 [B]

    @property
    def row_splits(self) -> np.ndarray:
        """int64 ``[B + 1]`` offsets of the rows in ``values``."""
        return np.concatenate([[0], np.cumsum(self.row_lengths)]).astype(np.int64)


FeatureArray = Union[np.ndarray, RaggedIds]


def criteo_like_fields(dim: int = 16, max_vocab: int | None = 200_000, alpha: float = 1.1) -> list[FieldSpec]:
    """The 26 one-hot categorical fields ``C1..C26`` of Criteo with its published cardinalities.

    Criteo also has :data:`CRITEO_NUM_DENSE` (13) dense features; pass that as ``n_dense``.

    Args:
        dim: embedding width of every field.
        max_vocab: cap on each vocabulary (the three largest Criteo tables have 5-10 M rows; the
            default cap keeps all tables in a few hundred MiB). ``None`` keeps the real sizes.
        alpha: Zipf exponent of the ids.

    Returns:
        26 :class:`FieldSpec`, named ``C1`` .. ``C26``.

    Example:
        >>> fields = criteo_like_fields(dim=8, max_vocab=1000)
        >>> [f.vocab for f in fields][:4]
        [1000, 583, 1000, 1000]
    """
    cap = max_vocab if max_vocab is not None else max(CRITEO_CARDINALITIES)
    if cap < 1:
        raise ValueError(f"max_vocab must be >= 1 or None, got {max_vocab}.")
    return [
        FieldSpec(f"C{i + 1}", vocab=min(card, cap), dim=dim, alpha=alpha)
        for i, card in enumerate(CRITEO_CARDINALITIES)
    ]


def many_fields(
    n_fields: int = 200,
    dims: Sequence[int] = (8, 16, 32),
    multi_hot_fraction: float = 0.1,
    vocab_range: tuple[int, int] = (100, 100_000),
    max_len: int = 20,
    mean_len: float = 5.0,
    alpha: float = 1.1,
    seed: int = 0,
) -> list[FieldSpec]:
    """A wide model's schema: ``n_fields`` fields with mixed dims and vocabularies, some multi-hot.

    Vocabulary sizes are log-uniform in ``vocab_range``; dims are drawn from ``dims``; exactly
    ``round(n_fields * multi_hot_fraction)`` fields are multi-hot (mean combiner).

    Args:
        n_fields: number of fields, named ``f000``, ``f001``, ...
        dims: embedding widths to draw from.
        multi_hot_fraction: share of multi-hot fields, in ``[0, 1]``.
        vocab_range: smallest and largest vocabulary (inclusive).
        max_len: longest multi-hot row.
        mean_len: mean multi-hot row length.
        alpha: Zipf exponent of the ids.
        seed: seed of the random schema.

    Returns:
        ``n_fields`` :class:`FieldSpec`.

    Example:
        >>> fields = many_fields(n_fields=50, dims=(8, 16), multi_hot_fraction=0.2)
        >>> sum(f.multi_hot for f in fields)
        10
    """
    lo, hi = vocab_range
    if n_fields < 1 or not dims or not 0.0 <= multi_hot_fraction <= 1.0 or not 1 <= lo <= hi:
        raise ValueError(
            f"need n_fields >= 1, non-empty dims, multi_hot_fraction in [0, 1] and 1 <= vocab_range[0] <= "
            f"vocab_range[1]; got {n_fields}, {dims}, {multi_hot_fraction}, {vocab_range}."
        )
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5C4E3A]))
    vocabs = np.exp(rng.uniform(np.log(lo), np.log(hi + 1), size=n_fields)).astype(np.int64).clip(lo, hi)
    field_dims = rng.choice(np.asarray(dims, dtype=np.int64), size=n_fields)
    multi = np.zeros(n_fields, dtype=bool)
    multi[rng.choice(n_fields, size=round(n_fields * multi_hot_fraction), replace=False)] = True
    width = max(3, len(str(n_fields - 1)))
    return [
        FieldSpec(
            f"f{i:0{width}d}",
            vocab=int(vocabs[i]),
            dim=int(field_dims[i]),
            kind=MULTI_HOT if multi[i] else ONE_HOT,
            max_len=max_len if multi[i] else 1,
            mean_len=mean_len if multi[i] else 1.0,
            alpha=alpha,
        )
        for i in range(n_fields)
    ]


def din_fields(
    dim: int = 16,
    n_users: int = 10_000,
    n_items: int = 50_000,
    n_cates: int = 1_000,
    max_len: int = 50,
    mean_len: float = 15.0,
    alpha: float = 1.1,
) -> list[FieldSpec]:
    """A DIN-style (Alimama-like) schema: user, target item/category, and their behaviour sequences.

    ``hist_item`` / ``hist_cate`` are multi-hot sequences over the same vocabularies as the target
    fields ``item`` / ``cate``; :func:`hybridtf.models.din_like` pairs ``hist_<x>`` with ``<x>``.

    Args:
        dim: embedding width of every field (DIN's attention needs equal dims within a pair).
        n_users: vocabulary of ``user``.
        n_items: vocabulary of ``item`` and ``hist_item``.
        n_cates: vocabulary of ``cate`` and ``hist_cate``.
        max_len: longest behaviour sequence.
        mean_len: mean behaviour sequence length.
        alpha: Zipf exponent of the ids.

    Returns:
        Five :class:`FieldSpec`: ``user``, ``item``, ``cate``, ``hist_item``, ``hist_cate``.

    Example:
        >>> [f.name for f in din_fields()]
        ['user', 'item', 'cate', 'hist_item', 'hist_cate']
    """
    seq = {"kind": MULTI_HOT, "max_len": max_len, "mean_len": mean_len, "alpha": alpha, "dim": dim}
    return [
        FieldSpec("user", vocab=n_users, dim=dim, alpha=alpha),
        FieldSpec("item", vocab=n_items, dim=dim, alpha=alpha),
        FieldSpec("cate", vocab=n_cates, dim=dim, alpha=alpha),
        FieldSpec("hist_item", vocab=n_items, **seq),
        FieldSpec("hist_cate", vocab=n_cates, **seq),
    ]


def _check_fields(fields: Sequence[FieldSpec]) -> None:
    names = [f.name for f in fields]
    if not names:
        raise ValueError("need at least one field.")
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"field names must be unique, repeated: {dup}.")


def _seed(*entropy: int) -> int:
    """A 31-bit seed derived from ``entropy`` (stable across numpy versions and platforms)."""
    return int(np.random.SeedSequence(list(entropy)).generate_state(1)[0] >> 1)


def _label_weights(fields: Sequence[FieldSpec], n_dense: int, label_seed: int):
    """The fixed "true model" behind the labels: per-(field, id bucket) weights and dense weights."""
    rng = np.random.default_rng(np.random.SeedSequence([label_seed, 0x1ABE1]))
    per_field = [rng.standard_normal(min(f.vocab, _LABEL_BUCKETS)) for f in fields]
    return per_field, rng.standard_normal(n_dense)


def generate_batch(
    fields: Sequence[FieldSpec],
    n_dense: int,
    batch_size: int,
    index: int,
    seed: int = 0,
    signal: float = 2.0,
    label_seed: int = 0,
) -> tuple[dict[str, FeatureArray], np.ndarray]:
    """Batch number ``index`` of the stream ``(fields, n_dense, batch_size, seed)``, in numpy.

    Args:
        fields: the schema.
        n_dense: number of dense features (0 for none: then there is no ``"dense"`` key).
        batch_size: examples per batch.
        index: batch number (any non-negative int; batches are independent of each other).
        seed: stream seed.
        signal: standard deviation of the true logit (larger: labels easier to predict).
        label_seed: seed of the true model behind the labels (keep it fixed across train/test).

    Returns:
        ``(features, labels)``: ``features[name]`` is int64 ``[B]`` for a one-hot field and
        :class:`RaggedIds` for a multi-hot one; ``features["dense"]`` is float32 ``[B, n_dense]``
        (log-transformed counts, as Criteo's I1..I13 are usually fed); labels are float32 0/1 ``[B, 1]``.

    Example:
        >>> features, labels = generate_batch(criteo_like_fields(max_vocab=1000), 13, batch_size=4, index=0)
        >>> features["C1"].dtype, labels.shape
        (dtype('int64'), (4, 1))
    """
    _check_fields(fields)
    if batch_size < 1 or n_dense < 0 or index < 0:
        raise ValueError(f"need batch_size >= 1, n_dense >= 0, index >= 0; got {batch_size}, {n_dense}, {index}.")
    field_w, dense_w = _label_weights(fields, n_dense, label_seed)
    rng = np.random.default_rng(np.random.SeedSequence([seed, index]))
    features: dict[str, FeatureArray] = {}
    logit = np.zeros(batch_size)
    for i, (f, w) in enumerate(zip(fields, field_w)):
        if f.multi_hot:
            lengths = np.minimum(rng.poisson(f.mean_len, size=batch_size), f.max_len).astype(np.int64)
            ids = zipf_ids(int(lengths.sum()), f.vocab, f.alpha, seed=_seed(seed, index, i))
            features[f.name] = RaggedIds(ids, lengths)
            rows = np.repeat(np.arange(batch_size), lengths)
            logit += np.bincount(rows, weights=w[ids % w.size], minlength=batch_size) / np.maximum(lengths, 1)
        else:
            ids = zipf_ids(batch_size, f.vocab, f.alpha, seed=_seed(seed, index, i))
            features[f.name] = ids
            logit += w[ids % w.size]
    logit /= np.sqrt(len(fields))
    if n_dense:
        dense = np.log1p(rng.exponential(scale=5.0, size=(batch_size, n_dense)))
        features[DENSE_KEY] = dense.astype(np.float32)
        # E[log1p(Exp(scale=5))] = e^0.2 * E1(0.2) ~= 1.49: centre with a constant, not the batch mean.
        logit = (logit + (dense - 1.49) @ dense_w / np.sqrt(n_dense)) / np.sqrt(2.0)
    prob = 1.0 / (1.0 + np.exp(-signal * logit))
    labels = (rng.random(batch_size) < prob).astype(np.float32)[:, None]
    return features, labels


def generate_batches(
    fields: Sequence[FieldSpec],
    n_dense: int,
    batch_size: int,
    num_batches: int,
    seed: int = 0,
    signal: float = 2.0,
    label_seed: int = 0,
) -> Iterator[tuple[dict[str, FeatureArray], np.ndarray]]:
    """Batches ``0 .. num_batches - 1`` of :func:`generate_batch` (the numpy twin of :func:`make_dataset`).

    Use it for warm-up statistics (id frequencies) without building a graph.

    Example:
        >>> batches = generate_batches(din_fields(), 0, batch_size=64, num_batches=2)
        >>> hist_ids = np.concatenate([features["hist_item"].values for features, _ in batches])
        >>> counts = np.bincount(hist_ids)  # id frequencies of the hist_item table
    """
    for index in range(num_batches):
        yield generate_batch(fields, n_dense, batch_size, index, seed, signal, label_seed)


def _tf_specs(fields: Sequence[FieldSpec], n_dense: int, batch_size: int):
    import tensorflow as tf

    specs = {}
    for f in fields:
        if f.multi_hot:
            specs[f.name] = tf.RaggedTensorSpec([batch_size, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64)
        else:
            specs[f.name] = tf.TensorSpec([batch_size], tf.int64)
    if n_dense:
        specs[DENSE_KEY] = tf.TensorSpec([batch_size, n_dense], tf.float32)
    return specs, tf.TensorSpec([batch_size, 1], tf.float32)


def to_tensors(features: dict[str, FeatureArray]) -> dict:
    """Numpy features from :func:`generate_batch` as tensors (``RaggedIds`` -> ``tf.RaggedTensor``).

    Example:
        >>> features, labels = generate_batch(din_fields(), 0, batch_size=8, index=0)
        >>> to_tensors(features)["hist_item"].shape
        TensorShape([8, None])
    """
    import tensorflow as tf

    out = {}
    for name, value in features.items():
        if isinstance(value, RaggedIds):
            out[name] = tf.RaggedTensor.from_row_lengths(value.values, value.row_lengths, validate=False)
        else:
            out[name] = tf.convert_to_tensor(value)
    return out


def make_dataset(
    fields: Sequence[FieldSpec],
    n_dense: int,
    batch_size: int,
    num_batches: int,
    seed: int = 0,
    signal: float = 2.0,
    label_seed: int = 0,
):
    """A ``tf.data.Dataset`` of ``num_batches`` batches ``(features, labels)`` (see :func:`generate_batch`).

    One-hot features are int64 ``[B]``, multi-hot features ``tf.RaggedTensor`` int64 ``[B, None]``,
    ``features["dense"]`` float32 ``[B, n_dense]`` (absent when ``n_dense == 0``), labels float32
    ``[B, 1]``. The batch dimension is static. Batches are generated lazily in Python (a few ms per
    field and batch); for timing runs, ``.cache()`` the dataset and iterate it once before timing.

    Args:
        fields: the schema.
        n_dense: number of dense features.
        batch_size: examples per batch.
        num_batches: number of batches.
        seed: stream seed (same seed, same batches).
        signal: standard deviation of the true logit.
        label_seed: seed of the true model behind the labels (keep it fixed across train/test).

    Returns:
        The dataset, of known cardinality ``num_batches`` (``.repeat()`` it for more epochs).

    Example:
        >>> ds = make_dataset(din_fields(), n_dense=0, batch_size=32, num_batches=4, seed=1)
        >>> model.fit(ds)  # doctest: +SKIP
    """
    import tensorflow as tf

    _check_fields(fields)
    if num_batches < 0:
        raise ValueError(f"num_batches must be >= 0, got {num_batches}.")
    fields = tuple(fields)

    def gen():
        for features, labels in generate_batches(fields, n_dense, batch_size, num_batches, seed, signal, label_seed):
            yield to_tensors(features), labels

    dataset = tf.data.Dataset.from_generator(gen, output_signature=_tf_specs(fields, n_dense, batch_size))
    # A known cardinality lets Keras size epochs (and keeps optimizer.iterations equal to the steps run).
    return dataset.apply(tf.data.experimental.assert_cardinality(num_batches))
