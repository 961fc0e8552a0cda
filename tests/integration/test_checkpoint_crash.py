"""Crash-safe checkpoints: a save killed at any moment never leaves the newest complete checkpoint unreadable.

The states a kill can leave are built here with real files: a save interrupted after the previous
checkpoint's names were unlinked (its backup named by the state file), ``*_temp`` directories and
state-file temporaries of killed saves. Then real SIGKILLs: ``kill_checkpoint.py`` kills a child that
checkpoints every step (``save_weights``, ``ModelCheckpoint``, the Estimator) at random moments, and
checks that the newest complete checkpoint loads with the predictions recorded when it was written
(8 kills here; ``python tests/integration/kill_checkpoint.py --path <path> --kills 50`` for the full run).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from hybridtf._src.integrations import atomic_checkpoint
from hybridtf._src.integrations.keras_model import has_packed_tables
from tests.integration import kill_checkpoint


def _model():
    model = kill_checkpoint._keras_model()
    model.optimizer.build(model.trainable_variables)
    return model


def _train(model, seed):
    x, y = kill_checkpoint._data(seed)
    model.train_on_batch(x, y)
    return model(kill_checkpoint.EVAL_X, training=False).numpy()


def _listing(directory):
    return sorted(os.listdir(directory))


def test_save_leaves_only_the_checkpoint_files(tmp_path):
    model = _model()
    for seed in range(3):
        _train(model, seed)
        model.save_weights(str(tmp_path / "w"))
    assert _listing(tmp_path) == ["checkpoint", "w.data-00000-of-00001", "w.index"]
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "w")


def test_save_interrupted_after_the_old_files_went_leaves_the_backup_named(tmp_path):
    model = _model()
    want = _train(model, 0)
    model.save_weights(str(tmp_path / "w"))
    _train(model, 1)
    prefix = str(tmp_path / "w")
    # The process dies (SIGKILL: no Python code runs after it) before TensorFlow wrote anything new: the
    # context is entered and never left. (A save that raises puts the old files back instead:
    # tests/unit/test_atomic_checkpoint.py.)
    interrupted = atomic_checkpoint.protected(prefix)
    interrupted.__enter__()
    assert not os.path.exists(prefix + ".index")
    latest = tf.train.latest_checkpoint(str(tmp_path))
    assert os.path.basename(latest).startswith("w.htf-bak-")
    fresh = _model()
    fresh.load_weights(prefix)  # reads the backup the state file names
    np.testing.assert_allclose(fresh(kill_checkpoint.EVAL_X, training=False).numpy(), want, rtol=1e-6)
    assert int(fresh.optimizer.iterations.numpy()) == 1
    # The next save completes and removes the backup.
    want = _train(fresh, 2)
    fresh.save_weights(prefix)
    assert _listing(tmp_path) == ["checkpoint", "w.data-00000-of-00001", "w.index"]
    again = _model()
    again.load_weights(prefix)
    np.testing.assert_allclose(again(kill_checkpoint.EVAL_X, training=False).numpy(), want, rtol=1e-6)


def test_temporaries_of_killed_saves_are_removed_on_load_and_save(tmp_path):
    model = _model()
    _train(model, 0)
    model.save_weights(str(tmp_path / "w"))
    (tmp_path / "w_temp").mkdir()
    (tmp_path / "w_temp" / "part-00000-of-00001.index").write_bytes(b"partial")
    (tmp_path / ("checkpoint.tmp" + "0123abcd" * 4)).write_text("partial")
    (tmp_path / "model.htf-tmp-1234abcd.keras").write_bytes(b"partial")
    (tmp_path / "other_temp").mkdir()  # not this checkpoint's: kept
    _model().load_weights(str(tmp_path / "w"))
    assert _listing(tmp_path) == [
        "checkpoint",
        "model.htf-tmp-1234abcd.keras",
        "other_temp",
        "w.data-00000-of-00001",
        "w.index",
    ]
    model.save(str(tmp_path / "model.keras"))  # a Keras file: temporary name, then rename
    assert "model.htf-tmp-1234abcd.keras" not in _listing(tmp_path)
    assert "model.keras" in _listing(tmp_path)


def test_keras_file_is_written_whole_or_not_at_all(tmp_path):
    model = _model()
    want = _train(model, 0)
    model.save_weights(str(tmp_path / "m.weights.h5"))
    with pytest.raises(KeyboardInterrupt):
        with atomic_checkpoint.atomic_file(str(tmp_path / "m.weights.h5")) as tmp:
            with open(tmp, "wb") as f:
                f.write(b"half a file")
            raise KeyboardInterrupt
    assert _listing(tmp_path) == ["m.weights.h5"]
    (tmp_path / "m.htf-tmp-0123abcd.weights.h5").write_bytes(b"what a kill -9 left")
    fresh = _model()
    fresh.load_weights(str(tmp_path / "m.weights.h5"))
    np.testing.assert_allclose(fresh(kill_checkpoint.EVAL_X, training=False).numpy(), want, rtol=1e-6)
    assert _listing(tmp_path) == ["m.weights.h5"]  # load_weights removed the killed save's temporary


def test_wrapped_model_fn_saves_with_the_crash_safe_saver():
    from hybridtf._src.integrations.estimator_saver import CrashSafeSaver

    with tf.Graph().as_default():
        features = {k: tf.constant(v) for k, v in kill_checkpoint.EVAL_X.items()}
        tf.compat.v1.train.create_global_step()
        spec = htf.estimator.model_fn(kill_checkpoint._estimator_model_fn)(
            features, tf.zeros([kill_checkpoint.BATCH, 1]), tf.estimator.ModeKeys.TRAIN
        )
        assert isinstance(spec.scaffold.saver, CrashSafeSaver)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "kills", "dynamic"),
    [("save_weights", 4, False), ("modelcheckpoint", 2, False), ("estimator", 2, False), ("save_weights", 2, True)],
)
def test_sigkill_during_per_step_checkpointing(path, kills, dynamic, tmp_path):
    result = kill_checkpoint.run(path, kills, seed=7, directory=str(tmp_path), max_delay=1.0, dynamic=dynamic)
    assert result["loaded_and_matched"] == kills
    assert len(set(result["steps"])) >= 1


def _dynamic_only_model():
    """A model whose only packed tables are dynamic: ``optimize`` packs no static table (its own model class)."""
    ids = tf.keras.Input((2,), dtype=tf.int64)
    outs = [
        tf.keras.layers.Flatten()(htf.layers.DynamicEmbedding(4, seed=f, name=f"dyn{f}")(ids[:, f : f + 1]))
        for f in range(2)
    ]
    model = htf.keras.optimize(tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Concatenate()(outs))))
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1), loss="mse")
    assert not has_packed_tables(model) and htf.keras.is_optimized(model)
    return model


@pytest.mark.parametrize("name", ["w", "m.weights.h5", "m.keras"])
def test_a_killed_save_of_a_model_with_only_dynamic_tables_leaves_the_last_one_readable(tmp_path, name, monkeypatch):
    from keras.src.engine import training

    x = np.arange(64, dtype=np.int64).reshape(32, 2)
    y = np.ones((32, 1), np.float32)
    model = _dynamic_only_model()
    model.train_on_batch(x, y)
    want = model.predict(x, verbose=0)
    path = str(tmp_path / name)
    save = model.save if name.endswith(".keras") else model.save_weights
    save(path)
    model.train_on_batch(x, y)

    def killed(self, filepath, *args, **kwargs):  # the process dies half-way through writing
        target = os.fspath(filepath)
        with open(target if target.endswith((".keras", ".h5")) else target + ".index", "wb") as f:
            f.write(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(training.Model, "save" if name.endswith(".keras") else "save_weights", killed)
    with pytest.raises(KeyboardInterrupt):
        save(path)
    monkeypatch.undo()
    if name.endswith(".keras"):
        loaded = tf.keras.models.load_model(path)
    else:
        loaded = _dynamic_only_model()
        loaded.load_weights(path)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), want, rtol=1e-6)


def test_estimator_predict_removes_what_killed_saves_left(tmp_path):
    """PREDICT runs the plain model_fn; its Saver is crash-safe too: its restore removes ``*_temp`` directories."""
    model_dir = str(tmp_path / "est")
    est = kill_checkpoint._estimator(model_dir)
    x, y = kill_checkpoint._data(0)
    est.train(lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(kill_checkpoint.BATCH), steps=1)
    os.makedirs(os.path.join(model_dir, "model.ckpt-7_temp", "part-00000-of-00001"))  # a killed save's shards
    ds = lambda: tf.data.Dataset.from_tensor_slices(kill_checkpoint.EVAL_X).batch(kill_checkpoint.BATCH)  # noqa: E731
    assert len(list(est.predict(ds))) == kill_checkpoint.BATCH
    assert not [d for d in os.listdir(model_dir) if d.endswith("_temp")]
