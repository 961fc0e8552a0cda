"""Checkpoints and SavedModels: an optimized Keras model keeps the plain model's per-table layout.

A checkpoint written by the optimized model restores into the plain model and the other way
round (``save_weights`` / ``load_weights``, ``tf.train.Checkpoint``, ``CheckpointManager``);
``model.save`` (SavedModel and ``.keras``) and ``tf.saved_model.save`` serve the same
predictions; wrapping a trained model changes no prediction; a checkpoint of another table layout
is refused with a message naming the table and both shapes; a failed step leaves the last
checkpoint usable. Small W&D models (functional and subclassed) trained a few Adagrad steps.

Optimizer state (every format, both layouts, resumed training) is tested in
``test_checkpoint_formats.py``; crash safety in ``test_checkpoint_crash.py``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.saved_model import loader_impl

import hybridtf as htf
from hybridtf._src.models import ctr_data, ctr_models
from hybridtf._src.rewrite.packed_storage import CheckpointLayoutError

FIELDS = ctr_data.criteo_like_fields(dim=8, max_vocab=300)[:6]
N_DENSE = 4
BATCH = 32
TRAIN_STEPS = 4
KINDS = ("functional", "subclassed")
DIRECTIONS = ("wrapped_to_plain", "plain_to_wrapped")


@pytest.fixture(scope="module")
def batches():
    raw = ctr_data.generate_batches(FIELDS, N_DENSE, BATCH, TRAIN_STEPS + 2, seed=3)
    return [(ctr_data.to_tensors(x), tf.constant(y)) for x, y in raw]


def _build(kind, batches, fields=FIELDS, wrapped=False):
    if kind == "functional":
        model = ctr_models.wide_and_deep(fields, N_DENSE, hidden=(16, 8), seed=7)
    else:
        model = ctr_models.WideAndDeepModel(fields, N_DENSE, hidden=(16, 8), seed=7)
    model({k: tf.zeros_like(v) for k, v in batches[0][0].items()})  # id 0 is in every vocabulary
    return htf.keras.optimize(model) if wrapped else model


def _compile(model):
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    return model


def _train(model, batches):
    _compile(model)
    for x, y in batches[:TRAIN_STEPS]:
        model.train_on_batch(x, y)
    return model


@pytest.fixture(scope="module")
def trained(batches):
    """``trained(kind, wrapped)``: a model trained a few steps (shared: only read, saved, never changed)."""
    cache = {}

    def get(kind, wrapped):
        if (kind, wrapped) not in cache:
            cache[kind, wrapped] = _train(_build(kind, batches, wrapped=wrapped), batches)
        return cache[kind, wrapped]

    return get


def _source_and_fresh(direction, kind, trained, batches):
    src_wrapped = direction == "wrapped_to_plain"
    return trained(kind, src_wrapped), _build(kind, batches, wrapped=not src_wrapped)


def _assert_same_model(restored, source, x):
    """Same weights (bit for bit, plain order and shapes) and the same predictions."""
    for got, want in zip(restored.get_weights(), source.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    _assert_same_predictions(restored(x, training=False), source, x)


def _assert_same_predictions(got, source, x):
    # Same weights; the optimized graph may round differently in the last bit.
    np.testing.assert_allclose(np.asarray(got), source(x, training=False), rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- TF checkpoints


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("kind", KINDS)
def test_save_weights_restores_across_layouts(kind, direction, trained, batches, tmp_path):
    source, fresh = _source_and_fresh(direction, kind, trained, batches)
    prefix = str(tmp_path / "ckpt")
    source.save_weights(prefix)
    fresh.load_weights(prefix).assert_existing_objects_matched()
    _assert_same_model(fresh, source, batches[-1][0])


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_keras_v3_weights_file_restores_across_layouts(direction, trained, batches, tmp_path):
    source, fresh = _source_and_fresh(direction, "functional", trained, batches)
    path = str(tmp_path / "model.weights.h5")
    source.save_weights(path)
    fresh.load_weights(path)
    _assert_same_model(fresh, source, batches[-1][0])


def test_legacy_hdf5_is_refused_not_written_without_tables(trained, batches, tmp_path):
    model = trained("functional", True)
    for save in (model.save_weights, model.save, model.load_weights):
        with pytest.raises(NotImplementedError, match=r"legacy HDF5 format.*Keras v3 format"):
            save(str(tmp_path / "model.h5"))
    assert not (tmp_path / "model.h5").exists()
    # a ModelCheckpoint to one is refused when fit starts, not after the first epoch's training
    model = _compile(_build("functional", batches, wrapped=True))  # the shared trained model stays unchanged
    steps = model.optimizer.iterations.numpy()
    for weights_only in (False, True):
        callback = tf.keras.callbacks.ModelCheckpoint(str(tmp_path / "best-{epoch}.h5"), save_weights_only=weights_only)
        with pytest.raises(NotImplementedError, match=r"legacy HDF5 format"):
            model.fit(*batches[0], epochs=1, verbose=0, callbacks=[callback])
    assert model.optimizer.iterations.numpy() == steps


@pytest.mark.parametrize("kind", KINDS)
def test_checkpoint_keys_are_the_plain_models(kind, trained, tmp_path):
    keys = {}
    for wrapped in (False, True):
        prefix = str(tmp_path / f"wrapped_{wrapped}" / "ckpt")
        trained(kind, wrapped).save_weights(prefix)
        keys[wrapped] = {name for name, _ in tf.train.list_variables(prefix)}
    model_keys = {wrapped: {k for k in ks if not k.startswith("optimizer/")} for wrapped, ks in keys.items()}
    assert model_keys[True] == model_keys[False]
    assert any("embeddings/.ATTRIBUTES/VARIABLE_VALUE" in k for k in model_keys[True])
    assert not any("packed" in k for k in keys[True])  # packed variables are not in checkpoints
    # Slot keys are positional (see the module docstring); the optimizer's own state matches.
    shared = {"optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE", "optimizer/_learning_rate/.ATTRIBUTES/VARIABLE_VALUE"}
    assert shared <= keys[True] and shared <= keys[False]


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("kind", KINDS)
def test_tf_train_checkpoint_restores_across_layouts(kind, direction, trained, batches, tmp_path):
    source, fresh = _source_and_fresh(direction, kind, trained, batches)
    path = tf.train.Checkpoint(model=source).save(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(model=fresh).restore(path).assert_existing_objects_matched()
    _assert_same_model(fresh, source, batches[-1][0])


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_checkpoint_manager_restores_latest_across_layouts(direction, batches, tmp_path):
    src_wrapped = direction == "wrapped_to_plain"
    source = _compile(_build("functional", batches, wrapped=src_wrapped))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=source), str(tmp_path), max_to_keep=2)
    for x, y in batches[:TRAIN_STEPS]:
        source.train_on_batch(x, y)
        manager.save()
    assert len(manager.checkpoints) == 2
    fresh = _build("functional", batches, wrapped=not src_wrapped)
    fresh_manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=fresh), str(tmp_path), max_to_keep=2)
    assert fresh_manager.restore_or_initialize() == manager.latest_checkpoint
    _assert_same_model(fresh, source, batches[-1][0])


def test_optimizer_state_resumes_in_the_same_layout(batches, tmp_path):
    """Wrapped -> wrapped keeps the optimizer state too: resumed training equals uninterrupted training."""
    source = _train(_build("functional", batches, wrapped=True), batches)
    prefix = str(tmp_path / "ckpt")
    source.save_weights(prefix)
    resumed = _compile(_build("functional", batches, wrapped=True))
    resumed.load_weights(prefix)
    for x, y in batches[TRAIN_STEPS:]:
        np.testing.assert_allclose(resumed.train_on_batch(x, y), source.train_on_batch(x, y), rtol=1e-6)
    _assert_same_model(resumed, source, batches[-1][0])


# --------------------------------------------------------------------------- SavedModel


def _hybridtf_ops(export_dir) -> set[str]:
    graph = loader_impl.parse_saved_model(str(export_dir)).meta_graphs[0].graph_def
    ops = {node.op for node in graph.node}
    ops.update(node.op for fn in graph.library.function for node in fn.node_def)
    return {op for op in ops if op.startswith("HybridTF")}


@pytest.mark.parametrize("kind", KINDS)
def test_keras_saved_model_serves_same_predictions(kind, trained, batches, tmp_path):
    source = trained(kind, True)
    source.save(str(tmp_path / "model"))
    assert _hybridtf_ops(tmp_path / "model") == set()  # the export needs no hybridtf to serve
    loaded = tf.keras.models.load_model(str(tmp_path / "model"))
    assert not htf.keras.is_optimized(loaded)
    x = batches[-1][0]
    _assert_same_predictions(loaded(x, training=False), source, x)
    if kind == "functional":  # a plain functional model again, with the same weights in the same order
        _assert_same_model(loaded, source, x)


@pytest.mark.parametrize("kind", KINDS)
def test_keras_v3_format_serves_same_predictions(kind, trained, batches, tmp_path):
    source = trained(kind, True)
    path = str(tmp_path / "model.keras")
    source.save(path)
    loaded = tf.keras.models.load_model(path)
    assert not htf.keras.is_optimized(loaded)
    _assert_same_model(loaded, source, batches[-1][0])


@pytest.mark.parametrize("kind", KINDS)
def test_tf_saved_model_export_serves_same_predictions(kind, trained, batches, tmp_path):
    source = trained(kind, True)
    tf.saved_model.save(source, str(tmp_path / "export"))
    assert _hybridtf_ops(tmp_path / "export") == set()
    loaded = tf.saved_model.load(str(tmp_path / "export"))
    x = batches[-1][0]
    _assert_same_predictions(loaded(x), source, x)
    (served,) = loaded.signatures["serving_default"](**x).values()
    _assert_same_predictions(served, source, x)


# --------------------------------------------------------------------------- wrapping, layout, failures


@pytest.mark.parametrize("kind", KINDS)
def test_optimizing_a_trained_model_changes_no_prediction(kind, batches):
    model = _train(_build(kind, batches), batches)
    x = batches[-1][0]
    weights = model.get_weights()
    before = model(x, training=False)
    htf.keras.optimize(model)
    assert htf.keras.is_optimized(model) and model.hybridtf_skipped == []
    for got, want in zip(model.get_weights(), weights, strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(model(x, training=False), before, rtol=1e-6, atol=1e-7)


LAYOUT_CHANGES = {
    "vocab": (1, {"vocab": 200}, r"'emb_C2' has shape \[200, 8\] but the value to restore has shape \[300, 8\]"),
    "dim": (2, {"dim": 4}, r"'emb_C3' has shape \[300, 4\] but the value to restore has shape \[300, 8\]"),
}


@pytest.mark.parametrize("how", ["load_weights", "tf_train_checkpoint"])
@pytest.mark.parametrize("change", sorted(LAYOUT_CHANGES))
def test_restoring_another_table_layout_names_table_and_shapes(change, how, trained, batches, tmp_path):
    index, replace, message = LAYOUT_CHANGES[change]
    fields = list(FIELDS)
    fields[index] = dataclasses.replace(fields[index], **replace)
    source = trained("functional", False)  # written by the plain model: the user changed the schema
    target = _build("functional", batches, fields=fields, wrapped=True)
    with pytest.raises(CheckpointLayoutError, match=message):
        if how == "load_weights":
            source.save_weights(str(tmp_path / "ckpt"))
            target.load_weights(str(tmp_path / "ckpt"))
        else:
            path = tf.train.Checkpoint(model=source).save(str(tmp_path / "ckpt"))
            tf.train.Checkpoint(model=target).restore(path)


def _dataset(batches):
    spec = tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), batches[0])
    return tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=spec)


@pytest.mark.parametrize("kind", KINDS)
def test_failure_mid_training_leaves_last_checkpoint_usable(kind, batches, tmp_path):
    model = _compile(_build(kind, batches, wrapped=True))
    bad_x = dict(batches[0][0])
    bad_x["C2"] = tf.tensor_scatter_nd_update(bad_x["C2"], [[5]], tf.constant([10_000], tf.int64))
    steps = 2
    stream = batches[:steps] * 2 + [(bad_x, batches[0][1])]  # epochs 1 and 2 fine, epoch 3 fails at once
    save = tf.keras.callbacks.ModelCheckpoint(str(tmp_path / "ckpt-{epoch}"), save_weights_only=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"embedding table '(emb|wide)_C2' got id 10000"):
        model.fit(_dataset(stream), epochs=3, steps_per_epoch=steps, callbacks=[save], verbose=0)
    last = tf.train.latest_checkpoint(str(tmp_path))
    assert last.endswith("ckpt-2")
    x = batches[-1][0]
    # The failed step changed nothing: the last checkpoint holds the model's current weights.
    plain = _build(kind, batches)
    plain.load_weights(last).assert_existing_objects_matched()
    _assert_same_model(plain, model, x)


def _towers(same_names):
    """Two towers built as functional sub-models, each an Embedding followed by a Dense (with
    ``same_names``, built by one function that names its layers: Keras allows that in sub-models)."""
    tf.keras.utils.set_random_seed(5)

    def tower(name, vocab):
        prefix = "tower" if same_names else name
        ids = tf.keras.Input((1,), dtype=tf.int64)
        rows = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(vocab, 8, name=f"{prefix}_emb")(ids))
        return tf.keras.Model(ids, tf.keras.layers.Dense(4, name=f"{prefix}_proj")(rows), name=name)

    user, item = tf.keras.Input((1,), dtype=tf.int64, name="u"), tf.keras.Input((1,), dtype=tf.int64, name="i")
    score = tf.keras.layers.Dot(axes=1)([tower("user", 50)(user), tower("item", 80)(item)])
    return tf.keras.Model([user, item], tf.keras.layers.Activation("sigmoid")(score))


@pytest.mark.parametrize("same_names", [False, True])
def test_nested_functional_towers_pack_and_keep_their_checkpoint_keys(same_names, tmp_path):
    rng = np.random.default_rng(0)
    x = {"u": rng.integers(0, 50, (32, 1)), "i": rng.integers(0, 80, (32, 1))}
    y = rng.integers(0, 2, (32, 1)).astype(np.float32)
    keys, losses = {}, {}
    for wrapped in (False, True):
        model = htf.keras.optimize(_towers(same_names)) if wrapped else _towers(same_names)
        model.compile(optimizer="adam", loss="binary_crossentropy")
        losses[wrapped] = [model.train_on_batch(x, y) for _ in range(3)]
        model.save_weights(str(tmp_path / f"w{wrapped}"))
        keys[wrapped] = {k for k, _ in tf.train.list_variables(str(tmp_path / f"w{wrapped}"))}
        other = _towers(same_names) if wrapped else htf.keras.optimize(_towers(same_names))  # the other layout
        other.load_weights(str(tmp_path / f"w{wrapped}"))
        np.testing.assert_array_equal(other.predict(x, verbose=0), model.predict(x, verbose=0))
    assert keys[True] == keys[False]
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-5)
    tables = [m.name for pt in model.hybridtf_plan.packed_tables for m in pt.members]
    assert model.hybridtf_skipped == [] and len(tables) == 2  # one repeated name: "item.tower_emb"


class _Interrupt(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise RuntimeError("interrupted")


def test_backup_and_restore_resumes_an_interrupted_fit_exactly(tmp_path):
    rng = np.random.default_rng(1)
    x = {"u": rng.integers(0, 50, (64, 1)), "i": rng.integers(0, 80, (64, 1))}
    y = rng.integers(0, 2, (64, 1)).astype(np.float32)

    def fit(callbacks):
        model = htf.keras.optimize(_towers(False))
        model.compile(optimizer="adam", loss="binary_crossentropy")
        return model.fit(x, y, batch_size=16, epochs=4, verbose=0, shuffle=False, callbacks=callbacks)

    uninterrupted = fit([]).history["loss"]
    backup = tf.keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    with pytest.raises(RuntimeError, match="interrupted"):
        fit([backup, _Interrupt()])
    resumed = fit([tf.keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))]).history["loss"]
    np.testing.assert_allclose(resumed, uninterrupted[2:], rtol=1e-6)


def test_a_tower_of_an_optimized_model_exports_on_its_own(tmp_path):
    """``tf.saved_model.save`` of a sub-model (a two-tower model's item tower): its export holds the packed rows."""
    towers = []
    for name, vocab in (("user", 40), ("item", 60)):
        ids = tf.keras.Input((1,), dtype="int64")
        emb = tf.keras.layers.Embedding(vocab, 8, name=f"{name}_emb")(ids)
        towers.append(tf.keras.Model(ids, tf.keras.layers.Flatten()(emb), name=f"{name}_tower"))
    uid, iid = tf.keras.Input((1,), dtype="int64"), tf.keras.Input((1,), dtype="int64")
    model = htf.keras.optimize(
        tf.keras.Model([uid, iid], tf.keras.layers.Dot(axes=1)([towers[0](uid), towers[1](iid)]))
    )
    assert len(model.hybridtf_plan.packed_tables) == 1  # both tables in one packed variable
    ids = tf.constant([[14], [3], [59]], tf.int64)
    tf.saved_model.save(towers[1], str(tmp_path / "item_tower"))
    assert _hybridtf_ops(tmp_path / "item_tower") == set()
    loaded = tf.saved_model.load(str(tmp_path / "item_tower"))
    np.testing.assert_array_equal(loaded(ids).numpy(), towers[1](ids).numpy())


def _damage(path, how):
    data = bytearray(path.read_bytes())
    if how == "cut":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:  # four bytes overwritten at each tenth of the file (every tensor's, some deferred to the optimizer)
        for at in range(len(data) // 10, len(data) - 4, len(data) // 10):
            data[at : at + 4] = bytes(b ^ 0xFF for b in data[at : at + 4])
        path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("fmt", "part", "how"),
    [
        ("tf", "data-00000-of-00001", "cut"),  # TensorFlow: IndexError: Read less bytes than requested
        ("tf", "data-00000-of-00001", "flip"),  # DataLossError: checksum does not match
        ("tf", "index", "cut"),  # OpError: not an sstable
        ("keras", None, "cut"),  # zipfile / h5py errors
        ("keras", None, "flip"),
    ],
)
def test_a_damaged_checkpoint_is_refused_naming_the_path_and_the_fix(fmt, part, how, trained, batches, tmp_path):
    """A checkpoint cut short or overwritten (a failed copy, a disk error) raised TensorFlow's, h5py's or zipfile's
    own errors, some naming neither the file nor what to do (found by a probe): one DataLossError now."""
    model = trained("functional", True)
    if fmt == "tf":
        prefix = tmp_path / "weights"
        model.save_weights(str(prefix))
        damaged, path = tmp_path / f"weights.{part}", str(prefix)
    else:  # a zip archive with CRCs (a bare .weights.h5 has no checksums: HDF5 reads overwritten bytes as they are)
        damaged = path = tmp_path / "model.keras"
        model.save(str(path))
    _damage(damaged, how)
    fresh = _compile(_build("functional", batches, wrapped=True))
    with pytest.raises(tf.errors.DataLossError, match="damaged") as raised:
        fresh.load_weights(path)
    assert str(path) in str(raised.value) and "Restore an earlier checkpoint" in str(raised.value)
    # an error of another kind passes as it is: a path that holds no checkpoint
    with pytest.raises(tf.errors.NotFoundError):
        fresh.load_weights(str(tmp_path / "missing"))
