"""The built-in example configurations by short name: ``wdl``, ``deepfm``, ``dlrm``, ``din`` on ``criteo`` or ``f200``.

The report command (``python -m hybridtf.report --model wdl``), the demos and ``benchmarks/bench_keras.py``
build the same models on the same field sets through these functions, so their numbers describe
one model. This module imports TensorFlow only inside :func:`build_example` and
:func:`example_batch` (the benchmark's parent process stays TensorFlow-free).

Field sets:

* ``criteo``: the 26 Criteo-like fields (:func:`~hybridtf._src.models.ctr_data.criteo_like_fields`,
  dim 16, vocabularies capped at 100,000); for DIN, two behaviour sequences ``hist_<x>`` over the
  two largest tables.
* ``f200``: 200 fields (:func:`~hybridtf._src.models.ctr_data.many_fields`), dims 8 and 16,
  vocabularies 100 .. 100,000; for DIN, 10% multi-hot fields.

Example:
    >>> fields = example_fields("criteo", quick=True)
    >>> features, labels = example_batch(fields, batch=64)
    >>> model = build_example("wdl", fields, features)
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridtf._src.models import ctr_data

EXAMPLE_MODELS = ("wdl", "deepfm", "dlrm", "din")
"""Short names of the built-in example models (builders in ``ctr_models.MODELS``)."""

FIELD_SETS = ("criteo", "f200")
"""Names of the built-in field sets."""

N_DENSE = ctr_data.CRITEO_NUM_DENSE
"""Dense features of every example configuration (Criteo's 13)."""


def example_fields(
    field_set: str, *, din: bool = False, quick: bool = False, dims: Sequence[int] | None = None, seed: int = 0
) -> list[ctr_data.FieldSpec]:
    """The fields of a built-in field set.

    Args:
        field_set: ``"criteo"`` or ``"f200"`` (``"200"`` is accepted for ``"f200"``).
        din: add the behaviour sequences a DIN model attends over.
        quick: a small variant (dim 8, vocabularies <= 1,000; 20 fields for ``f200``) for fast tests.
        dims: embedding widths of the ``f200`` fields (default ``(8, 16)``).
        seed: seed of the ``f200`` field set's random vocabularies and dims.

    Returns:
        A list of ``FieldSpec``.

    Raises:
        ValueError: an unknown field set.

    Example:
        >>> len(example_fields("f200", quick=True))
        20
    """
    if field_set == "criteo":
        fields = ctr_data.criteo_like_fields(dim=8 if quick else 16, max_vocab=1_000 if quick else 100_000)
        if din:  # behaviour sequences over the two largest tables, sharing their tables
            targets = sorted(fields, key=lambda f: -f.vocab)[:2]
            fields += [
                ctr_data.FieldSpec(
                    f"hist_{t.name}", t.vocab, t.dim, kind=ctr_data.MULTI_HOT, max_len=20, mean_len=5.0, alpha=t.alpha
                )
                for t in sorted(targets, key=fields.index)
            ]
        return fields
    if field_set in ("f200", "200"):
        return ctr_data.many_fields(
            n_fields=20 if quick else 200,
            dims=tuple(dims) if dims else (8, 16),
            multi_hot_fraction=0.1 if din else 0.0,
            vocab_range=(10, 1_000) if quick else (100, 100_000),
            seed=seed,
        )
    raise ValueError(f"unknown field set {field_set!r}; use one of {FIELD_SETS}.")


def din_pairs(fields: Sequence[ctr_data.FieldSpec]) -> dict[str, str] | None:
    """DIN attention pairs: None (``din_like``'s ``hist_<x> -> <x>`` default) or multi-hot -> one-hot of the same dim.

    Example:
        >>> din_pairs(example_fields("criteo", din=True)) is None
        True
    """
    names = {f.name for f in fields}
    if any(f.multi_hot and f.name.startswith("hist_") and f.name[5:] in names for f in fields):
        return None
    free = [f for f in fields if not f.multi_hot]
    pairs = {}
    for seq in (f for f in fields if f.multi_hot):
        target = next((t for t in free if t.dim == seq.dim), None)
        if target is None:
            raise ValueError(f"no one-hot field of dim {seq.dim} left to pair with the sequence {seq.name!r}.")
        free.remove(target)
        pairs[seq.name] = target.name
    return pairs


def example_batch(fields: Sequence[ctr_data.FieldSpec], batch: int = 256, *, n_dense: int = N_DENSE, seed: int = 0):
    """Batch 0 of the synthetic stream of ``fields`` as tensors ``(features, labels)``.

    Example:
        >>> features, labels = example_batch(example_fields("criteo", quick=True), batch=8)
        >>> labels.shape
        TensorShape([8, 1])
    """
    import tensorflow as tf

    x, y = ctr_data.generate_batch(fields, n_dense, batch, 0, seed=seed)
    return ctr_data.to_tensors(x), tf.constant(y)


def build_example(
    model: str,
    fields: Sequence[ctr_data.FieldSpec],
    sample_x=None,
    *,
    n_dense: int = N_DENSE,
    hidden: Sequence[int] = (64, 32),
    seed: int = 0,
):
    """The plain Keras example model ``model`` on ``fields``; built on ``sample_x`` when given.

    Two calls with the same arguments give the same layer names and initial weights.

    Args:
        model: ``"wdl"``, ``"deepfm"``, ``"dlrm"`` or ``"din"``.
        fields: the schema (e.g. :func:`example_fields`).
        sample_x: a feature dict to build the model on (None: left unbuilt; functional models are built anyway).
        n_dense: number of dense features.
        hidden: widths of the (top) MLP.
        seed: seed of every initializer.

    Returns:
        An uncompiled ``tf.keras.Model``.

    Raises:
        ValueError: an unknown model name.
    """
    from hybridtf._src.models import ctr_models

    if model not in ctr_models.MODELS:
        raise ValueError(f"unknown example model {model!r}; use one of {EXAMPLE_MODELS}.")
    kwargs = {"hidden": tuple(hidden), "seed": seed}
    if model == "din":
        kwargs["attention_pairs"] = din_pairs(fields)
    built = ctr_models.MODELS[model](fields, n_dense, **kwargs)
    if sample_x is not None:
        built(sample_x)
    return built
