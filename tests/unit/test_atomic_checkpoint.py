"""``atomic_checkpoint.protected``: a save that raises leaves the previous checkpoint under its own name.

A kill mid-save is covered by ``tests/integration/test_checkpoint_crash.py``; here the save fails
with an exception (a full disk, a file-size limit): the old files and the old state file come back
before the error propagates, so TensorFlow's own readers (``tf.train.load_checkpoint``, serving,
warm start) still read the prefix the user gave, as after plain TensorFlow's failed save.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from hybridtf._src.integrations.atomic_checkpoint import protected

KEY = "v/.ATTRIBUTES/VARIABLE_VALUE"


def _save(prefix, value):
    tf.train.Checkpoint(v=tf.Variable(value)).write(prefix)
    tf.__internal__.train.update_checkpoint_state(
        save_dir=os.path.dirname(prefix),
        model_checkpoint_path=prefix,
        all_model_checkpoint_paths=[prefix],
        save_relative_paths=True,
    )


def _backups(directory):
    return [n for n in os.listdir(directory) if ".htf-bak-" in n]


@pytest.mark.parametrize("partial", [False, True])
def test_a_save_that_raises_puts_the_previous_checkpoint_back(tmp_path, partial):
    prefix = str(tmp_path / "ckpt")
    _save(prefix, 1.0)
    with pytest.raises(OSError, match="No space left"), protected(prefix):
        if partial:  # the failed save had written part of its files already
            with open(prefix + ".index", "wb") as f:
                f.write(b"half an index")
        raise OSError(28, "No space left on device")
    assert tf.train.load_checkpoint(prefix).get_tensor(KEY) == 1.0
    assert tf.train.latest_checkpoint(str(tmp_path)) == prefix
    assert not _backups(tmp_path)


def test_a_save_that_succeeds_leaves_only_the_new_checkpoint(tmp_path):
    prefix = str(tmp_path / "ckpt")
    _save(prefix, 1.0)
    with protected(prefix):
        _save(prefix, 2.0)
    assert tf.train.load_checkpoint(prefix).get_tensor(KEY) == 2.0
    assert not _backups(tmp_path)


FILE_SIZE_LIMIT = textwrap.dedent(
    """
    import os, resource, signal, sys
    import numpy as np
    import tensorflow as tf
    import hybridtf as htf

    directory = sys.argv[1]
    ids = tf.keras.Input((1,), dtype=tf.int64)
    emb = [tf.keras.layers.Embedding(5000, 16, name=f"emb_{i}")(ids) for i in range(2)]
    out = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(tf.keras.layers.Concatenate()(emb)))
    model = htf.keras.optimize(tf.keras.Model(ids, out))
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1), loss="mse")
    x, y = np.arange(64).reshape(64, 1), np.ones((64, 1), np.float32)
    model.fit(x, y, batch_size=16, verbose=0)
    model.save_weights(os.path.join(directory, "ckpt"))
    saved = tf.train.load_checkpoint(os.path.join(directory, "ckpt"))
    want = {k: saved.get_tensor(k) for k in saved.get_variable_to_shape_map()}
    model.fit(x, y, batch_size=16, verbose=0)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))  # a full disk
    try:
        model.save_weights(os.path.join(directory, "ckpt"))
    except Exception as err:
        print("save failed:", type(err).__name__)
    else:
        sys.exit("the save under a 4 KiB file-size limit did not fail")
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    got = tf.train.load_checkpoint(os.path.join(directory, "ckpt"))
    assert sorted(got.get_variable_to_shape_map()) == sorted(want), "other keys"
    assert all(np.array_equal(got.get_tensor(k), v) for k, v in want.items()), "other values"
    assert tf.train.latest_checkpoint(directory) == os.path.join(directory, "ckpt")
    print("previous checkpoint intact")
    """
)


def test_save_weights_that_hits_a_file_size_limit_leaves_the_previous_checkpoint_readable(tmp_path):
    script = tmp_path / "limit.py"
    script.write_text(FILE_SIZE_LIMIT)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], check=False, capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "previous checkpoint intact" in run.stdout


def _read_only(monkeypatch):
    """Removals fail as on a read-only mount (root ignores permission bits, so a chmod cannot show it)."""

    def refuse(path, *args, **kwargs):
        raise OSError(30, "Read-only file system", path)

    monkeypatch.setattr(os, "remove", refuse)
    monkeypatch.setattr(os, "unlink", refuse)


def test_reading_a_read_only_directory_with_leftovers_of_killed_saves_skips_their_cleanup(tmp_path, monkeypatch):
    """An evaluation job reading the training job's checkpoints from a read-only mount: the optimized model's
    ``load_weights`` and an Estimator's restore failed with ``OSError: [Errno 30] Read-only file system``
    naming a ``checkpoint.tmp<hex>`` TensorFlow left, while plain TensorFlow read the checkpoint."""
    from hybridtf._src.integrations import atomic_checkpoint

    prefix = str(tmp_path / "ckpt")
    _save(prefix, 3.0)
    leftovers = [tmp_path / ("checkpoint.tmp" + "ab" * 16), tmp_path / "ckpt.htf-bak-0123abcd.index"]
    for path in leftovers:
        path.write_bytes(b"left by a killed save")
    (tmp_path / "m.htf-tmp-0123abcd.keras").write_bytes(b"left by a killed save")
    _read_only(monkeypatch)
    assert atomic_checkpoint.resolve(prefix) == prefix
    atomic_checkpoint.clean_file(str(tmp_path / "m.keras"), reading=True)
    assert all(path.exists() for path in leftovers)
    assert tf.train.load_checkpoint(prefix).get_tensor(KEY) == 3.0
    with pytest.raises(OSError, match="Read-only"):  # a save cannot write either: it fails at once
        atomic_checkpoint.clean(prefix)
    monkeypatch.undo()
    assert atomic_checkpoint.resolve(prefix) == prefix  # writable again: cleaned as before
    assert not any(path.exists() for path in leftovers)


def test_an_optimized_model_loads_from_a_read_only_directory_with_leftovers(tmp_path, monkeypatch):
    import numpy as np

    import hybridtf as htf

    def build():
        ids = tf.keras.Input((1,), dtype=tf.int64)
        out = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(tf.keras.layers.Embedding(50, 4)(ids)))
        model = htf.keras.optimize(tf.keras.Model(ids, out))
        model.compile(tf.keras.optimizers.Adagrad(0.1), "mse")
        return model

    x = np.arange(8, dtype=np.int64)[:, None]
    trained = build()
    trained.train_on_batch(x, np.ones((8, 1)))
    trained.save_weights(str(tmp_path / "w"))
    trained.save_weights(str(tmp_path / "w.weights.h5"))
    (tmp_path / ("checkpoint.tmp" + "cd" * 16)).write_bytes(b"")
    (tmp_path / "w.htf-tmp-0123abcd.weights.h5").write_bytes(b"")
    _read_only(monkeypatch)
    for path in ("w", "w.weights.h5"):
        restored = build()
        restored.load_weights(str(tmp_path / path))
        np.testing.assert_array_equal(restored(x).numpy(), trained(x).numpy())


def test_a_failed_save_names_the_checkpoint_not_only_a_temporary(tmp_path, monkeypatch):
    """A full disk met in hybridtf's own steps of a save named only ``checkpoint.tmp<hex>`` or a backup's file,
    and a ``.keras`` save's error no path at all."""
    from hybridtf._src.integrations import atomic_checkpoint

    prefix = str(tmp_path / "ckpt")
    _save(prefix, 4.0)

    def full(source, target, *args, **kwargs):
        raise OSError(28, "No space left on device", target)

    with monkeypatch.context() as patch:
        patch.setattr(os, "link", full)
        patch.setattr(atomic_checkpoint.shutil, "copy2", full)
        with pytest.raises(OSError, match=f"No space left on device: hybridtf could not save {prefix} ") as err:
            with protected(prefix):
                pytest.fail("the save ran")
    assert err.value.errno == 28 and "still readable" in str(err.value)
    assert tf.train.load_checkpoint(atomic_checkpoint.resolve(prefix)).get_tensor(KEY) == 4.0

    target = tmp_path / "m.keras"
    target.write_bytes(b"the previous file")
    with pytest.raises(OSError, match=f"hybridtf could not save {target} "):
        with atomic_checkpoint.atomic_file(target):
            raise OSError(28, "No space left on device")  # as zipfile raises it, without a path
    assert target.read_bytes() == b"the previous file"
    assert not any(".htf-tmp" in n for n in os.listdir(tmp_path))
