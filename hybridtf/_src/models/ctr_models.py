"""Plain Keras CTR models: the unchanged user code that hybridtf wraps, and the baseline it is timed against.

Every model reads the feature dict of :func:`hybridtf.models.make_dataset` (one-hot ids int64
``[B]``, multi-hot ids ``tf.RaggedTensor`` int64 ``[B, None]``, ``"dense"`` float32 ``[B, n_dense]``)
and returns a sigmoid click probability ``[B, 1]``. Embedding lookups are stock
``tf.keras.layers.Embedding`` layers, one per field, named ``emb_<field>`` (wide / first-order
parts: ``wide_<field>`` / ``fo_<field>``); a multi-hot field is looked up with the same layer on the
ragged ids and pooled over the row by :class:`RaggedPooling` (``pool_<field>``, the field's combiner).

Every layer has an explicit name and a seeded initializer: two builds with the same ``seed`` have the
same layer names and the same initial weights, and the functional and subclassed variants of a model
(:class:`WideAndDeepModel`, :class:`DLRMModel`) have the same weights as each other.

Example:
    >>> from hybridtf.models import CRITEO_NUM_DENSE, criteo_like_fields, make_dataset
    >>> fields = criteo_like_fields(dim=16, max_vocab=10_000)
    >>> model = MODELS["dlrm"](fields, CRITEO_NUM_DENSE, seed=0)
    >>> model.compile(optimizer="adagrad", loss="binary_crossentropy")
    >>> model.fit(make_dataset(fields, CRITEO_NUM_DENSE, batch_size=256, num_batches=20))  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping, Sequence

import tensorflow as tf

from hybridtf._src.models.ctr_data import DENSE_KEY, FieldSpec
from hybridtf._src.models.layers import (
    AttentionPooling,
    DotInteraction,
    FMInteraction,
    RaggedPooling,
    SeedStream,
    SumFeatures,
)


def _check(fields: Sequence[FieldSpec], n_dense: int) -> tuple[FieldSpec, ...]:
    fields = tuple(fields)
    names = [f.name for f in fields]
    if not fields or len(set(names)) != len(names):
        raise ValueError(f"need at least one field and unique field names, got {names}.")
    if n_dense < 0:
        raise ValueError(f"n_dense must be >= 0, got {n_dense}.")
    return fields


def model_inputs(fields: Sequence[FieldSpec], n_dense: int) -> dict[str, tf.keras.layers.Layer]:
    """Keras ``Input`` tensors matching :func:`hybridtf.models.make_dataset`'s feature dict.

    Args:
        fields: the schema.
        n_dense: number of dense features (no ``"dense"`` input when 0).

    Returns:
        ``{name: Input}``: int64 ``[B]`` per one-hot field, ragged int64 ``[B, None]`` per multi-hot
        field, float32 ``[B, n_dense]`` under ``"dense"``.

    Example:
        >>> model_inputs([FieldSpec("user", 100)], n_dense=2)["user"].shape
        TensorShape([None])
    """
    inputs = {}
    for f in _check(fields, n_dense):
        if f.multi_hot:
            inputs[f.name] = tf.keras.Input(shape=(None,), ragged=True, dtype=tf.int64, name=f.name)
        else:
            inputs[f.name] = tf.keras.Input(shape=(), dtype=tf.int64, name=f.name)
    if n_dense:
        inputs[DENSE_KEY] = tf.keras.Input(shape=(n_dense,), dtype=tf.float32, name=DENSE_KEY)
    return inputs


def _embedding(f: FieldSpec, seeds: SeedStream, prefix: str = "emb", dim: int | None = None):
    return tf.keras.layers.Embedding(
        f.vocab, dim or f.dim, embeddings_initializer=seeds.uniform(), name=f"{prefix}_{f.name}"
    )


def _embedding_set(fields, seeds, prefix="emb", dim=None, combiner=None):
    """Embedding layers ``{name: Embedding}`` and poolings ``{name: RaggedPooling}`` (multi-hot only)."""
    layers = {f.name: _embedding(f, seeds, prefix, dim) for f in fields}
    pool_prefix = "pool" if prefix == "emb" else f"{prefix}_pool"
    pools = {
        f.name: RaggedPooling(combiner or f.combiner, name=f"{pool_prefix}_{f.name}") for f in fields if f.multi_hot
    }
    return layers, pools


def _lookup(fields, layers, pools, inputs) -> list:
    """``[B, D]`` per field: embedding lookup, then pooling for multi-hot fields."""
    out = []
    for f in fields:
        x = layers[f.name](inputs[f.name])
        out.append(pools[f.name](x) if f.multi_hot else x)
    return out


def _mlp(prefix: str, widths: Sequence[int], seeds: SeedStream) -> list:
    return [
        tf.keras.layers.Dense(int(w), activation="relu", kernel_initializer=seeds.glorot(), name=f"{prefix}_{i}")
        for i, w in enumerate(widths)
    ]


def _apply(layers, x):
    for layer in layers:
        x = layer(x)
    return x


def _merge(layer, xs):
    """``layer(xs)`` for a Concatenate / Add layer; Keras merge layers reject a single input."""
    return xs[0] if len(xs) == 1 else layer(xs)


def _common_dim(fields: Sequence[FieldSpec], dim: int | None) -> int:
    """Width of the interaction space: ``dim`` if given, else the largest field dim (= the dim if all agree)."""
    return int(dim) if dim is not None else max(f.dim for f in fields)


def _projections(fields, dim, seeds) -> dict:
    """Linear maps ``proj_<name>`` to ``dim`` for fields whose embedding width differs from it."""
    return {
        f.name: tf.keras.layers.Dense(dim, use_bias=False, kernel_initializer=seeds.glorot(), name=f"proj_{f.name}")
        for f in fields
        if f.dim != dim
    }


def _project(fields, projections, vectors) -> list:
    return [projections[f.name](v) if f.name in projections else v for f, v in zip(fields, vectors)]


def _head(obj, seeds, hidden, prefix):
    obj.concat = tf.keras.layers.Concatenate(name=f"{prefix}_concat")
    obj.mlp = _mlp(prefix, hidden, seeds)
    obj.mlp_out = tf.keras.layers.Dense(1, kernel_initializer=seeds.glorot(), name=f"{prefix}_logit")


class _FieldsModelConfig:
    """``get_config`` / ``from_config`` for subclassed models built from ``(fields, n_dense, **args)``."""

    def _init_fields(self, fields, n_dense, **args) -> None:
        self._field_specs = _check(fields, n_dense)
        self._n_dense = int(n_dense)
        self._builder_args = args

    def get_config(self):
        fields = [dataclasses.asdict(f) for f in self._field_specs]
        return {"fields": fields, "n_dense": self._n_dense, **self._builder_args, "name": self.name}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        return cls([FieldSpec(**f) for f in config.pop("fields")], **config)


# --------------------------------------------------------------------------- Wide & Deep


def _wdl_layers(obj, fields, n_dense, hidden, seed) -> None:
    seeds = SeedStream(seed)
    obj.deep_embeddings, obj.deep_poolings = _embedding_set(fields, seeds)
    obj.wide_embeddings, obj.wide_poolings = _embedding_set(fields, seeds, prefix="wide", dim=1, combiner="sum")
    obj.wide_linear = (
        tf.keras.layers.Dense(1, kernel_initializer=seeds.glorot(), name="wide_linear") if n_dense else None
    )
    obj.wide_sum = SumFeatures(name="wide_sum")
    _head(obj, seeds, hidden, "deep")
    obj.logit = tf.keras.layers.Add(name="logit")
    obj.prob = tf.keras.layers.Activation("sigmoid", name="prob")


def _wdl_forward(obj, fields, n_dense, inputs):
    wide = _lookup(fields, obj.wide_embeddings, obj.wide_poolings, inputs)
    deep = _lookup(fields, obj.deep_embeddings, obj.deep_poolings, inputs)
    if n_dense:
        wide.append(obj.wide_linear(inputs[DENSE_KEY]))
        deep.append(inputs[DENSE_KEY])
    deep_logit = obj.mlp_out(_apply(obj.mlp, _merge(obj.concat, deep)))
    return obj.prob(obj.logit([obj.wide_sum(wide), deep_logit]))


def wide_and_deep(
    fields: Sequence[FieldSpec], n_dense: int, hidden: Sequence[int] = (64, 32), seed: int = 0, name: str = "wdl"
) -> tf.keras.Model:
    """Functional Wide & Deep (Cheng et al. 2016).

    Wide part: a 1-wide embedding per field (``wide_<field>``, sum-pooled for multi-hot) summed with
    a linear layer on the dense features. Deep part: the field embeddings (``emb_<field>``, any dims)
    concatenated with the dense features, through a ReLU MLP. Output ``sigmoid(wide + deep)``.

    Args:
        fields: the schema.
        n_dense: number of dense features.
        hidden: widths of the deep MLP.
        seed: seed of every initializer.
        name: model name.

    Returns:
        An uncompiled ``tf.keras.Model`` from the feature dict to ``[B, 1]`` probabilities.

    Example:
        >>> model = wide_and_deep([FieldSpec("user", 100, 8), FieldSpec("item", 500, 8)], n_dense=3)
        >>> model.compile(optimizer="adagrad", loss="binary_crossentropy")
    """
    fields = _check(fields, n_dense)
    parts = types.SimpleNamespace()
    _wdl_layers(parts, fields, n_dense, hidden, seed)
    inputs = model_inputs(fields, n_dense)
    return tf.keras.Model(inputs, _wdl_forward(parts, fields, n_dense, inputs), name=name)


class WideAndDeepModel(_FieldsModelConfig, tf.keras.Model):
    """Subclassed Wide & Deep, the same math and initial weights as :func:`wide_and_deep`.

    The embedding layers are attributes: ``deep_embeddings`` / ``wide_embeddings`` (dicts keyed by
    field name) plus ``deep_poolings`` / ``wide_poolings`` for the multi-hot fields.

    Args:
        fields, n_dense, hidden, seed, name: as for :func:`wide_and_deep`.

    Example:
        >>> model = WideAndDeepModel([FieldSpec("user", 100, 8)], n_dense=0)
        >>> model({"user": tf.constant([1, 2], tf.int64)}).shape
        TensorShape([2, 1])
    """

    def __init__(
        self,
        fields: Sequence[FieldSpec],
        n_dense: int,
        hidden: Sequence[int] = (64, 32),
        seed: int = 0,
        name: str = "wdl_subclassed",
        **kwargs,
    ):
        super().__init__(name=name, **kwargs)
        self._init_fields(fields, n_dense, hidden=list(hidden), seed=seed)
        _wdl_layers(self, self._field_specs, self._n_dense, hidden, seed)

    def call(self, inputs, training=None):
        return _wdl_forward(self, self._field_specs, self._n_dense, inputs)


# --------------------------------------------------------------------------- DeepFM


def deepfm(
    fields: Sequence[FieldSpec],
    n_dense: int,
    hidden: Sequence[int] = (64, 32),
    fm_dim: int | None = None,
    seed: int = 0,
    name: str = "deepfm",
) -> tf.keras.Model:
    """Functional DeepFM (Guo et al. 2017): first-order + FM second-order + deep MLP, sharing embeddings.

    First order: a 1-wide embedding per field (``fo_<field>``) plus a linear layer on the dense
    features. Second order: FM over the field embeddings ``emb_<field>``. The FM needs one common
    width: ``fm_dim`` if given, else the fields' dim when they all agree, else the largest dim; a
    field of another width is mapped to it by a bias-free linear layer ``proj_<field>`` (with equal
    dims there are no projections and this is textbook DeepFM). Deep: the (unprojected) embeddings
    concatenated with the dense features through a ReLU MLP.

    Args:
        fields: the schema.
        n_dense: number of dense features.
        hidden: widths of the deep MLP.
        fm_dim: common width of the FM embeddings (see above).
        seed: seed of every initializer.
        name: model name.

    Returns:
        An uncompiled ``tf.keras.Model`` from the feature dict to ``[B, 1]`` probabilities.

    Example:
        >>> model = deepfm([FieldSpec("user", 100, 8), FieldSpec("item", 500, 8)], n_dense=0)
    """
    fields = _check(fields, n_dense)
    seeds = SeedStream(seed)
    dim = _common_dim(fields, fm_dim)
    embeddings, poolings = _embedding_set(fields, seeds)
    fo_embeddings, fo_poolings = _embedding_set(fields, seeds, prefix="fo", dim=1, combiner="sum")
    projections = _projections(fields, dim, seeds)
    head = types.SimpleNamespace()
    _head(head, seeds, hidden, "deep")

    inputs = model_inputs(fields, n_dense)
    first = _lookup(fields, fo_embeddings, fo_poolings, inputs)
    vectors = _lookup(fields, embeddings, poolings, inputs)
    deep = list(vectors)
    if n_dense:
        first.append(tf.keras.layers.Dense(1, kernel_initializer=seeds.glorot(), name="fo_dense")(inputs[DENSE_KEY]))
        deep.append(inputs[DENSE_KEY])
    first_order = SumFeatures(name="first_order")(first)
    second_order = FMInteraction(name="fm")(_project(fields, projections, vectors))
    deep_logit = head.mlp_out(_apply(head.mlp, _merge(head.concat, deep)))
    logit = tf.keras.layers.Add(name="logit")([first_order, second_order, deep_logit])
    return tf.keras.Model(inputs, tf.keras.layers.Activation("sigmoid", name="prob")(logit), name=name)


# --------------------------------------------------------------------------- DLRM


def _dlrm_layers(obj, fields, n_dense, hidden, bottom, dim, seed) -> None:
    seeds = SeedStream(seed)
    obj.embeddings, obj.poolings = _embedding_set(fields, seeds)
    obj.projections = _projections(fields, dim, seeds)
    obj.bottom_mlp = _mlp("bottom", [*bottom, dim], seeds) if n_dense else []
    obj.interaction = DotInteraction(name="interaction")
    _head(obj, seeds, hidden, "top")
    obj.prob = tf.keras.layers.Activation("sigmoid", name="prob")


def _dlrm_forward(obj, fields, n_dense, inputs):
    vectors = _project(fields, obj.projections, _lookup(fields, obj.embeddings, obj.poolings, inputs))
    top = []
    if n_dense:
        dense = _apply(obj.bottom_mlp, inputs[DENSE_KEY])
        vectors.insert(0, dense)
        top.append(dense)
    top.append(obj.interaction(vectors))
    return obj.prob(obj.mlp_out(_apply(obj.mlp, _merge(obj.concat, top))))


def dlrm(
    fields: Sequence[FieldSpec],
    n_dense: int,
    hidden: Sequence[int] = (64, 32),
    bottom: Sequence[int] = (64,),
    interaction_dim: int | None = None,
    seed: int = 0,
    name: str = "dlrm",
) -> tf.keras.Model:
    """Functional DLRM (Naumov et al. 2019): bottom MLP, pairwise dot interactions, top MLP.

    The dense features go through the bottom MLP (``bottom`` widths then ``interaction_dim``, ReLU);
    its output and the field embeddings (``emb_<field>``) take pairwise dot products
    (:class:`DotInteraction`); the bottom output concatenated with the dot products goes through the
    top MLP (``hidden``). Dot products need one width: ``interaction_dim`` if given, else the fields'
    dim when they all agree, else the largest; other widths are mapped by ``proj_<field>``.

    Args:
        fields: the schema.
        n_dense: number of dense features (0: no bottom MLP, embeddings only).
        hidden: widths of the top MLP.
        bottom: hidden widths of the bottom MLP (its last layer has ``interaction_dim`` units).
        interaction_dim: common width of the interacting vectors (see above).
        seed: seed of every initializer.
        name: model name.

    Returns:
        An uncompiled ``tf.keras.Model`` from the feature dict to ``[B, 1]`` probabilities.

    Example:
        >>> model = dlrm([FieldSpec("user", 100, 8), FieldSpec("item", 500, 8)], n_dense=13)
    """
    fields = _check(fields, n_dense)
    parts = types.SimpleNamespace()
    _dlrm_layers(parts, fields, n_dense, hidden, bottom, _common_dim(fields, interaction_dim), seed)
    inputs = model_inputs(fields, n_dense)
    return tf.keras.Model(inputs, _dlrm_forward(parts, fields, n_dense, inputs), name=name)


class DLRMModel(_FieldsModelConfig, tf.keras.Model):
    """Subclassed DLRM, the same math and initial weights as :func:`dlrm`.

    The embedding layers are attributes: ``embeddings`` (dict keyed by field name), ``poolings``
    (multi-hot fields) and ``projections`` (fields whose dim differs from the interaction dim).

    Args:
        fields, n_dense, hidden, bottom, interaction_dim, seed, name: as for :func:`dlrm`.

    Example:
        >>> model = DLRMModel([FieldSpec("user", 100, 8)], n_dense=2)
        >>> model({"user": tf.constant([1, 2], tf.int64), "dense": tf.ones([2, 2])}).shape
        TensorShape([2, 1])
    """

    def __init__(
        self,
        fields: Sequence[FieldSpec],
        n_dense: int,
        hidden: Sequence[int] = (64, 32),
        bottom: Sequence[int] = (64,),
        interaction_dim: int | None = None,
        seed: int = 0,
        name: str = "dlrm_subclassed",
        **kwargs,
    ):
        super().__init__(name=name, **kwargs)
        self._init_fields(
            fields, n_dense, hidden=list(hidden), bottom=list(bottom), interaction_dim=interaction_dim, seed=seed
        )
        dim = _common_dim(self._field_specs, interaction_dim)
        _dlrm_layers(self, self._field_specs, self._n_dense, hidden, bottom, dim, seed)

    def call(self, inputs, training=None):
        return _dlrm_forward(self, self._field_specs, self._n_dense, inputs)


# --------------------------------------------------------------------------- DIN


def _attention_pairs(fields, pairs: Mapping[str, str] | None) -> dict[str, str]:
    by_name = {f.name: f for f in fields}
    if pairs is None:
        pairs = {
            f.name: f.name[len("hist_") :]
            for f in fields
            if f.multi_hot and f.name.startswith("hist_") and f.name[len("hist_") :] in by_name
        }
    for seq, target in pairs.items():
        s, t = by_name.get(seq), by_name.get(target)
        if s is None or t is None or not s.multi_hot or t.multi_hot or s.dim != t.dim:
            raise ValueError(
                f"attention pair {seq!r} -> {target!r} needs a multi-hot sequence field and a one-hot target field "
                "of the same dim."
            )
    if not pairs:
        raise ValueError(
            "din_like needs at least one (sequence, target) pair: name a multi-hot field hist_<x> next to a one-hot "
            "field <x>, or pass attention_pairs={sequence: target}."
        )
    return dict(pairs)


def din_like(
    fields: Sequence[FieldSpec],
    n_dense: int,
    hidden: Sequence[int] = (64, 32),
    attention_hidden: Sequence[int] = (32,),
    attention_pairs: Mapping[str, str] | None = None,
    share_embeddings: bool = True,
    seed: int = 0,
    name: str = "din",
) -> tf.keras.Model:
    """Functional DIN-style model (Zhou et al. 2018): target attention over behaviour sequences.

    Each (sequence, target) pair, e.g. ``hist_item -> item``, pools the sequence's embeddings with
    :class:`AttentionPooling` (``att_<sequence>``) queried by the target's embedding. With
    ``share_embeddings`` (DIN's usual setup) a sequence whose vocab and dim equal its target's is
    looked up in the target's table (``emb_item`` serves ``item`` and ``hist_item``: one table, two
    lookups); otherwise it has its own ``emb_<sequence>``. Other multi-hot fields are pooled with
    their combiner. All vectors and the dense features are concatenated into a ReLU MLP.

    Args:
        fields: the schema (see :func:`hybridtf.models.din_fields`).
        n_dense: number of dense features.
        hidden: widths of the MLP.
        attention_hidden: widths of the attention MLP.
        attention_pairs: ``{sequence field: target field}``; by default each multi-hot ``hist_<x>``
            is paired with a one-hot ``<x>``.
        share_embeddings: look sequences up in their target's table when vocab and dim agree.
        seed: seed of every initializer.
        name: model name.

    Returns:
        An uncompiled ``tf.keras.Model`` from the feature dict to ``[B, 1]`` probabilities.

    Raises:
        ValueError: no valid (sequence, target) pair.

    Example:
        >>> from hybridtf.models import din_fields
        >>> model = din_like(din_fields(dim=8), n_dense=0)
    """
    fields = _check(fields, n_dense)
    pairs = _attention_pairs(fields, attention_pairs)
    by_name = {f.name: f for f in fields}
    seeds = SeedStream(seed)
    # sequence field -> the target field whose table it reads
    shared = {s: t for s, t in pairs.items() if share_embeddings and by_name[s].vocab == by_name[t].vocab}
    embeddings = {f.name: _embedding(f, seeds) for f in fields if f.name not in shared}
    embeddings.update({s: embeddings[t] for s, t in shared.items()})
    attention = {s: AttentionPooling(attention_hidden, seed=seeds.next(), name=f"att_{s}") for s in pairs}
    poolings = {
        f.name: RaggedPooling(f.combiner, name=f"pool_{f.name}") for f in fields if f.multi_hot and f.name not in pairs
    }
    head = types.SimpleNamespace()
    _head(head, seeds, hidden, "deep")

    inputs = model_inputs(fields, n_dense)
    looked_up = {f.name: embeddings[f.name](inputs[f.name]) for f in fields}
    vectors = []
    for f in fields:
        if f.name in pairs:
            vectors.append(attention[f.name]([looked_up[pairs[f.name]], looked_up[f.name]]))
        elif f.multi_hot:
            vectors.append(poolings[f.name](looked_up[f.name]))
        else:
            vectors.append(looked_up[f.name])
    if n_dense:
        vectors.append(inputs[DENSE_KEY])
    logit = head.mlp_out(_apply(head.mlp, _merge(head.concat, vectors)))
    return tf.keras.Model(inputs, tf.keras.layers.Activation("sigmoid", name="prob")(logit), name=name)


MODELS = {"wdl": wide_and_deep, "deepfm": deepfm, "dlrm": dlrm, "din": din_like}
"""Functional builders by short name, all called as ``MODELS[name](fields, n_dense, hidden=..., seed=...)``."""

SUBCLASSED_MODELS = {"wdl": WideAndDeepModel, "dlrm": DLRMModel}
"""Subclassed variants with the same signature and initial weights as their functional builders."""
