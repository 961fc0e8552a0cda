"""Estimator ``warm_start_from`` with a wrapped model_fn: from plain and wrapped checkpoints, into both.

A warm-started wrapped model_fn trains like the plain model_fn warm-started the same way: 50 steps,
losses within 1e-5 relative. Settings: a checkpoint path, and ``WarmStartSettings`` with a regex
over the trainable variables, a list of names (global variables, optimizer slots included) and a
renamed table (``var_name_to_prev_var_name``). A table missing from the checkpoint is refused with
its name.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf.estimator as htf_estimator

FIELDS, VOCAB, DIM, BATCH = 5, 60, 4, 32
LOSS_KEY = "test_warm_start_loss"


def _data(seed):
    rng = np.random.default_rng(seed)
    n = BATCH * 10
    x = {f"C{i}": rng.integers(0, VOCAB, size=(n,)).astype(np.int64) for i in range(FIELDS)}
    y = (rng.random((n, 1)) < 0.3).astype(np.float32)
    return x, y


def _input_fn(seed):
    def input_fn():
        x, y = _data(seed)
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()

    return input_fn


def model_fn(features, labels, mode):
    deep, wide = [], []
    for i in range(FIELDS):
        init = tf.keras.initializers.RandomUniform(-0.1, 0.1, seed=i)
        deep.append(
            tf.keras.layers.Embedding(VOCAB, DIM, embeddings_initializer=init, name=f"emb_C{i}")(features[f"C{i}"])
        )
        winit = tf.keras.initializers.RandomUniform(-0.1, 0.1, seed=50 + i)
        wide.append(
            tf.keras.layers.Embedding(VOCAB, 1, embeddings_initializer=winit, name=f"wide_C{i}")(features[f"C{i}"])
        )
    h = tf.keras.layers.Dense(8, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(7))(
        tf.concat(deep, axis=1)
    )
    logit = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(8))(h) + tf.add_n(wide)
    loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, tf.sigmoid(logit)))
    tf.compat.v1.add_to_collection(LOSS_KEY, loss)
    train_op = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class _Losses(tf.compat.v1.train.SessionRunHook):
    def __init__(self):
        self.values = []

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(tf.compat.v1.get_collection(LOSS_KEY)[0])

    def after_run(self, run_context, run_values):
        self.values.append(float(run_values.results))


def _train(fn, model_dir, steps, seed, warm_start_from=None):
    config = tf.estimator.RunConfig(
        tf_random_seed=1, save_checkpoints_steps=10_000, save_summary_steps=None, log_step_count_steps=None
    )
    est = tf.estimator.Estimator(fn, model_dir=str(model_dir), config=config, warm_start_from=warm_start_from)
    losses = _Losses()
    est.train(_input_fn(seed), steps=steps, hooks=[losses])
    return np.array(losses.values)


WRAPPED = htf_estimator.model_fn(model_fn)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """``checkpoints[kind]``: a model dir trained 20 steps by the plain or the wrapped model_fn."""
    dirs = {}
    for kind, fn in (("plain", model_fn), ("wrapped", WRAPPED)):
        dirs[kind] = tmp_path_factory.mktemp(kind)
        _train(fn, dirs[kind], 20, seed=0)
    return dirs


def _settings(name, ckpt):
    if name == "path":
        return str(ckpt)
    if name == "regex":  # the deep tables and the first dense layer (TRAINABLE_VARIABLES)
        return tf.estimator.WarmStartSettings(str(ckpt), vars_to_warm_start="emb_|dense/")
    if name == "names":  # global variables by name: tables with their Adagrad slots, a renamed table
        return tf.estimator.WarmStartSettings(
            str(ckpt),
            vars_to_warm_start=["emb_C0/", "wide_C1/embeddings$", "emb_C3/embeddings:0"],
            var_name_to_prev_var_name={"emb_C3/embeddings": "emb_C2/embeddings"},
        )
    raise ValueError(name)


def _assert_warm_start_matches(source, settings, checkpoints, tmp_path):
    ckpt = checkpoints[source]
    plain = _train(model_fn, tmp_path / "plain", 50, seed=1, warm_start_from=_settings(settings, ckpt))
    wrapped = _train(WRAPPED, tmp_path / "wrapped", 50, seed=1, warm_start_from=_settings(settings, ckpt))
    np.testing.assert_allclose(wrapped, plain, rtol=1e-5)
    cold = _train(model_fn, tmp_path / "cold", 1, seed=1)
    assert abs(plain[0] - cold[0]) > 1e-4  # the warm start changed the model


@pytest.mark.parametrize("settings", ["path", "regex", "names"])
def test_warm_start_from_plain_checkpoint_matches_plain_model_fn(settings, checkpoints, tmp_path):
    _assert_warm_start_matches("plain", settings, checkpoints, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("settings", ["path", "names"])
def test_warm_start_from_wrapped_checkpoint_matches_plain_model_fn(settings, checkpoints, tmp_path):
    _assert_warm_start_matches("wrapped", settings, checkpoints, tmp_path)


def test_missing_table_is_named(checkpoints, tmp_path):
    settings = tf.estimator.WarmStartSettings(
        str(checkpoints["plain"]),
        vars_to_warm_start=["emb_C4/embeddings:0"],
        var_name_to_prev_var_name={"emb_C4/embeddings": "no_such/embeddings"},
    )
    with pytest.raises(ValueError, match=r"'no_such/embeddings' \(table 'emb_C4/embeddings'\) is not found"):
        _train(WRAPPED, tmp_path / "w", 1, seed=1, warm_start_from=settings)


@pytest.mark.parametrize("strategy", ["mod", "range"])
def test_sharded_rows_are_each_ranks_own_rows_of_the_checkpoint(strategy, tmp_path):
    """warm_start_rows on a shard (what each Horovod rank runs): its rows of the chosen members, the rest kept."""
    from hybridtf._src.distribute.layout import ShardLayout
    from hybridtf._src.distribute.world import World
    from hybridtf._src.integrations.estimator_warm_start import warm_start_rows

    sizes = {"a/embeddings": 7, "b/embeddings": 5, "c/embeddings": 6}  # members side by side: 18 rows
    parts, offset = [], 0
    for key, rows in sizes.items():
        parts.append((key, offset, rows))
        offset += rows
    saved = {
        key: np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) + 100 * i
        for i, (key, rows) in enumerate(sizes.items())
    }
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        for key, value in saved.items():
            tf.Variable(value, name=key.split("/")[0] + "/embeddings")
        sess.run(tf.compat.v1.global_variables_initializer())
        ckpt = tf.compat.v1.train.Saver().save(sess, str(tmp_path / "ckpt"))
    shapes = tf.train.load_checkpoint(ckpt).get_variable_to_shape_map()
    whole = np.concatenate([saved["a/embeddings"], -np.ones([5, 2], np.float32), saved["c/embeddings"]])
    for size in (2, 3, 4):
        layout = ShardLayout(18, size, strategy)
        for rank in range(size):
            if strategy == "mod":
                own = [r for r in range(18) if r % size == rank]
            else:
                own = list(range(layout.bounds[rank], layout.bounds[rank + 1]))
            with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
                var = tf.Variable(-np.ones([len(own), 2], np.float32), name="packed")
                warm_start_rows(
                    var, parts, {"a/embeddings", "c/embeddings"}, {}, ckpt, shapes, shard=(layout, World(rank, size))
                )
                sess.run(var.initializer)
                np.testing.assert_array_equal(sess.run(var), whole[own], err_msg=f"{strategy} rank {rank} of {size}")
