"""DeepCTR 0.9.4 models on the benchmark's synthetic field sets (``hybridtf.models``).

DeepCTR is what many users train CTR models with; its models reach the same
dataflow as ``hybridtf.models`` through DeepCTR's own layers (``Linear``,
``Concat``, ``FM``, ``CrossNet``, ``CIN``, ``AttentionSequencePoolingLayer``)
and give every Embedding an ``l2`` regularizer (``l2_reg_embedding=1e-5``).
Models are built with DeepCTR's default arguments; only the feature columns and
the seed come from here:

* one ``SparseFeat`` per one-hot field (its vocabulary and dim) and one
  ``DenseFeat("dense", n_dense)`` for the dense features, in both the linear and
  the DNN feature columns (input ``dense_features``: a Keras layer of DeepCTR's is named ``dense``);
* DIN: every multi-hot field becomes the behaviour sequence ``hist_<target>``
  (a ``VarLenSparseFeat`` sharing the target's table, padded to ``max_len``
  with 0, ids shifted by one; DeepCTR masks id 0), the targets are DIN's
  ``history_feature_list``.

``adapt`` maps a ``ctr_data.make_dataset`` batch to these inputs (in the input
pipeline, before caching). Requires ``deepctr`` (``requirements/test-nodeps.txt``).

Example:
    >>> fields = ctr_data.criteo_like_fields(dim=16)
    >>> model = build("deepfm", fields, 13)
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridtf._src.models import ctr_data

KINDS = ("wdl", "deepfm", "dcn", "xdeepfm", "din")
DENSE = "dense_features"  # ctr_data's "dense" would clash with the name of a Keras Dense layer in DeepCTR's models


def din_targets(fields: Sequence[ctr_data.FieldSpec]) -> dict[str, str]:
    """Multi-hot field -> the one-hot field it attends over (``hist_<x>`` -> ``<x>``, else a free one of its dim
    whose vocabulary holds the sequence's ids)."""
    names = {f.name for f in fields}
    free = [f for f in fields if not f.multi_hot]
    pairs = {}
    for seq in (f for f in fields if f.multi_hot):
        if seq.name.startswith("hist_") and seq.name[5:] in names:
            target = next(f for f in free if f.name == seq.name[5:])
        else:  # the sequence shares the target's table: same dim, and a vocabulary that holds its ids
            target = next((f for f in free if f.dim == seq.dim and f.vocab >= seq.vocab), None)
            if target is None:
                raise ValueError(
                    f"DIN: no free one-hot field of dim {seq.dim} with a vocabulary of at least {seq.vocab} "
                    f"to pair with the sequence {seq.name!r}; name it hist_<field> or add such a field."
                )
        free.remove(target)
        pairs[seq.name] = target.name
    return pairs


def feature_columns(kind: str, fields: Sequence[ctr_data.FieldSpec], n_dense: int) -> list:
    """DeepCTR feature columns for ``fields`` (see the module docstring)."""
    from deepctr.feature_column import DenseFeat, SparseFeat, VarLenSparseFeat

    targets = din_targets(fields) if kind == "din" else {}
    if kind != "din" and any(f.multi_hot for f in fields):
        raise ValueError(f"DeepCTR {kind} here takes one-hot fields only; multi-hot fields are DIN's sequences.")
    by_target = {t: s for s, t in targets.items()}
    vocab = {f.name: f.vocab for f in fields}
    cols = []
    for f in fields:
        if f.multi_hot:
            continue
        size = f.vocab + 1 if f.name in by_target else f.vocab  # row 0: the sequences' padding
        cols.append(SparseFeat(f.name, vocabulary_size=size, embedding_dim=f.dim))
    for seq, target in targets.items():
        spec = next(f for f in fields if f.name == seq)
        inner = SparseFeat(f"hist_{target}", vocab[target] + 1, embedding_dim=spec.dim, embedding_name=target)
        cols.append(VarLenSparseFeat(inner, maxlen=spec.max_len))
    if n_dense:
        cols.append(DenseFeat(DENSE, n_dense))
    return cols


def build(kind: str, fields: Sequence[ctr_data.FieldSpec], n_dense: int, seed: int = 0):
    """DeepCTR model ``kind`` with its default arguments (``seed`` set)."""
    from deepctr import models

    cols = feature_columns(kind, fields, n_dense)
    if kind == "din":
        history = [t for t in din_targets(fields).values()]
        return models.DIN(cols, history, seed=seed)
    maker = {"wdl": models.WDL, "deepfm": models.DeepFM, "dcn": models.DCN, "xdeepfm": models.xDeepFM}[kind]
    return maker(cols, cols, seed=seed)


def adapt(kind: str, fields: Sequence[ctr_data.FieldSpec]):
    """A ``dataset.map`` function: ctr_data batches -> DeepCTR inputs (DIN: padded, shifted sequences)."""
    import tensorflow as tf

    targets = din_targets(fields) if kind == "din" else {}
    max_len = {f.name: f.max_len for f in fields}

    def fn(x, y):
        out = {DENSE if k == "dense" else k: v for k, v in x.items() if k not in targets}
        for seq, target in targets.items():
            ids = x[seq]
            out[f"hist_{target}"] = (ids + 1).to_tensor(default_value=0, shape=[None, max_len[seq]])
        return out, tf.reshape(y, [-1, 1])

    return fn
