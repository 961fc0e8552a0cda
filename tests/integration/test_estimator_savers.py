"""A model_fn's own Saver (Scaffold or ``SAVERS`` collection) writes and reads the plain layout when wrapped.

hybridtf rebuilds it with the same settings and entries, each packed variable's entries split per table, so a
model_fn that brings a Saver in one mode only (``max_to_keep`` in TRAIN, a moving averages' restore in EVAL) reads
in every mode what it wrote, and its checkpoints move to and from the plain model_fn.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

import hybridtf.estimator as htf_estimator
from tests.integration.test_estimator import input_fn, wdl_model_fn

TRAIN, EVAL = tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.EVAL


def _config(every=None):
    return tf.estimator.RunConfig(
        tf_random_seed=1, save_checkpoints_steps=every or 10_000, save_summary_steps=None, log_step_count_steps=None
    )


def _input():
    return input_fn()


def _evaluate(fn, model_dir):
    est = tf.estimator.Estimator(fn, model_dir=str(model_dir), config=_config())
    return est.evaluate(lambda: input_fn(repeat=False), steps=5)["loss"]


def keep_two_model_fn(features, labels, mode):
    """TRAIN brings a Saver that keeps two checkpoints; EVAL and PREDICT use the Estimator's."""
    spec = wdl_model_fn(features, labels, mode)
    if mode != TRAIN:
        return spec
    saver = tf.compat.v1.train.Saver(max_to_keep=2, sharded=True)
    return spec._replace(scaffold=tf.compat.v1.train.Scaffold(saver=saver))


def test_a_train_only_saver_writes_the_plain_layout_and_keeps_its_settings(tmp_path):
    for label, fn in (("plain", keep_two_model_fn), ("wrapped", htf_estimator.model_fn(keep_two_model_fn))):
        tf.estimator.Estimator(fn, model_dir=str(tmp_path / label), config=_config(every=5)).train(_input, steps=20)
    plain, wrapped = (dict(tf.train.list_variables(str(tmp_path / d))) for d in ("plain", "wrapped"))
    assert wrapped == plain and "emb_C3/embeddings/Adagrad" in wrapped
    state = tf.train.get_checkpoint_state(str(tmp_path / "wrapped"))
    assert [p.rsplit("-", 1)[1] for p in state.all_model_checkpoint_paths] == ["15", "20"]  # max_to_keep=2
    # EVAL (the Estimator's Saver) reads what TRAIN's Saver wrote; so does the plain model_fn
    loss = _evaluate(htf_estimator.model_fn(keep_two_model_fn), tmp_path / "wrapped")
    np.testing.assert_allclose(loss, _evaluate(keep_two_model_fn, tmp_path / "plain"), rtol=1e-5)
    np.testing.assert_allclose(_evaluate(keep_two_model_fn, tmp_path / "wrapped"), loss, rtol=1e-6)


def ema_model_fn(features, labels, mode):
    """Trains moving averages of the weights; EVAL restores the averages into the model's variables."""
    spec = wdl_model_fn(features, labels, mode)
    ema = tf.compat.v1.train.ExponentialMovingAverage(0.5)
    if mode == TRAIN:
        with tf.control_dependencies([spec.train_op]):
            return spec._replace(train_op=ema.apply(tf.compat.v1.trainable_variables()))
    saver = tf.compat.v1.train.Saver(ema.variables_to_restore())
    return spec._replace(scaffold=tf.compat.v1.train.Scaffold(saver=saver))


def test_moving_averages_restored_for_evaluation_like_the_plain_model_fn(tmp_path):
    for label, fn in (("plain", ema_model_fn), ("wrapped", htf_estimator.model_fn(ema_model_fn))):
        tf.estimator.Estimator(fn, model_dir=str(tmp_path / label), config=_config()).train(_input, steps=30)
    keys = dict(tf.train.list_variables(str(tmp_path / "wrapped")))
    assert keys == dict(tf.train.list_variables(str(tmp_path / "plain")))
    assert "emb_C3/embeddings/ExponentialMovingAverage" in keys
    loss = _evaluate(htf_estimator.model_fn(ema_model_fn), tmp_path / "wrapped")
    np.testing.assert_allclose(loss, _evaluate(ema_model_fn, tmp_path / "plain"), rtol=1e-5)
    # the averages, not the weights, were evaluated
    assert abs(loss - _evaluate(htf_estimator.model_fn(wdl_model_fn), tmp_path / "wrapped")) > 1e-4


def test_a_saver_in_the_savers_collection_is_rebuilt_too(tmp_path):
    def model_fn(features, labels, mode):
        spec = wdl_model_fn(features, labels, mode)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, tf.compat.v1.train.Saver(max_to_keep=1))
        return spec

    for label, fn in (("plain", model_fn), ("wrapped", htf_estimator.model_fn(model_fn))):
        tf.estimator.Estimator(fn, model_dir=str(tmp_path / label), config=_config()).train(_input, steps=3)
    plain, wrapped = (dict(tf.train.list_variables(str(tmp_path / d))) for d in ("plain", "wrapped"))
    assert wrapped == plain


def test_a_saver_subclass_is_kept_with_a_warning(tmp_path, caplog):
    class MySaver(tf.compat.v1.train.Saver):
        pass

    def model_fn(features, labels, mode):
        spec = wdl_model_fn(features, labels, mode)
        return spec._replace(scaffold=tf.compat.v1.train.Scaffold(saver=MySaver()))

    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        tf.estimator.Estimator(htf_estimator.model_fn(model_fn), model_dir=str(tmp_path), config=_config()).train(
            _input, steps=1
        )
    assert "Saver is a MySaver, kept as it is" in caplog.text
    assert not any(k.startswith("emb_C") for k, _ in tf.train.list_variables(str(tmp_path)))  # its packed layout


@pytest.mark.parametrize("keyed", [False, True])
def test_a_saver_of_some_variables_saves_its_tables_per_table(tmp_path, keyed):
    """A Saver given the embedding variables only (a list, or a dict under the plain names)."""

    def model_fn(features, labels, mode):
        spec = wdl_model_fn(features, labels, mode)
        tables = [v for v in tf.compat.v1.global_variables() if "emb" in v.op.name or "packed" in v.op.name]
        tables = [v for v in tables if "Adagrad" not in v.op.name]
        var_list = {v.op.name: v for v in tables} if keyed else tables
        return spec._replace(scaffold=tf.compat.v1.train.Scaffold(saver=tf.compat.v1.train.Saver(var_list)))

    tf.estimator.Estimator(htf_estimator.model_fn(model_fn), model_dir=str(tmp_path), config=_config()).train(
        _input, steps=1
    )
    keys = {k for k, _ in tf.train.list_variables(str(tmp_path))}
    assert "emb_C3/embeddings" in keys and "global_step" not in keys and not any("packed" in k for k in keys)


def _two_tables_model_fn(saver_kind, out=None):
    """Two Keras tables of one dim (one packed variable) and a Saver over their layers' ``embeddings``."""

    def model_fn(features, labels, mode):
        init = tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=1)
        emb = tf.keras.layers.Embedding(30, 4, embeddings_initializer=init, name="emb")
        emb2 = tf.keras.layers.Embedding(30, 4, embeddings_initializer=init, name="emb2")
        x = tf.concat([emb(features["id"]), emb2(features["id2"])], 1)
        logit = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(2), name="o")(x)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logit))
        step = tf.compat.v1.train.get_global_step()
        train_op = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=step)
        spec = tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
        if saver_kind == "scaffold_dict":  # every variable, the tables under keys of the model_fn's own
            var_list = {v.op.name: v for v in tf.compat.v1.global_variables() if not v.op.name.endswith("embeddings")}
            var_list.update({"my/emb": emb.embeddings, "my/emb2": emb2.embeddings})
            return spec._replace(scaffold=tf.compat.v1.train.Scaffold(saver=tf.compat.v1.train.Saver(var_list)))
        side = tf.compat.v1.train.Saver([emb.embeddings] if saver_kind == "side_list" else {"pre/emb": emb.embeddings})
        if saver_kind == "init_fn":  # pretrained rows of one table, loaded once at initialization
            scaffold = tf.compat.v1.train.Scaffold(init_fn=lambda _, session: side.restore(session, out))
            return spec._replace(scaffold=scaffold)

        class SaveAtEnd(tf.compat.v1.train.SessionRunHook):
            def end(self, session):
                side.save(session, out)

        return spec._replace(training_hooks=[SaveAtEnd()])

    return model_fn


def _two_tables_input():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 30, 128)
    y = (rng.random((128, 1)) < 0.3).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"id": ids, "id2": (ids * 7) % 30}, y)).batch(16).repeat()


def test_a_saver_keyed_by_table_views_writes_and_restores_the_plain_keys(tmp_path):
    fn = _two_tables_model_fn("scaffold_dict")
    for label, model_fn in (("plain", fn), ("wrapped", htf_estimator.model_fn(fn))):
        tf.estimator.Estimator(model_fn, str(tmp_path / label), config=_config()).train(_two_tables_input, steps=3)
    plain, wrapped = (dict(tf.train.list_variables(str(tmp_path / d))) for d in ("plain", "wrapped"))
    assert wrapped == plain and {"my/emb", "my/emb2"} <= set(wrapped)
    # the plain checkpoint restores into the wrapped model_fn (its packed variable restored whole), and on
    tf.estimator.Estimator(htf_estimator.model_fn(fn), str(tmp_path / "plain"), config=_config()).train(
        _two_tables_input, steps=2
    )
    tf.estimator.Estimator(fn, str(tmp_path / "wrapped"), config=_config()).train(_two_tables_input, steps=2)
    plain, wrapped = (tf.train.load_checkpoint(str(tmp_path / d)) for d in ("plain", "wrapped"))
    for key in ("my/emb", "my/emb2", "o/kernel"):
        np.testing.assert_allclose(plain.get_tensor(key), wrapped.get_tensor(key), rtol=1e-6, atol=1e-7)


def _trained_tables(tmp_path, kind, out):
    """Checkpoint values after 3 steps of the plain and the wrapped model_fn with a Saver of ``kind``."""
    values = {}
    for label in ("plain", "wrapped"):
        fn = _two_tables_model_fn(kind, out(label))
        fn = htf_estimator.model_fn(fn) if label == "wrapped" else fn
        tf.estimator.Estimator(fn, str(tmp_path / label), config=_config()).train(_two_tables_input, steps=3)
        values[label] = tf.train.load_checkpoint(str(tmp_path / label))
    return values


@pytest.mark.parametrize("kind", ["side_list", "side_dict"])
def test_a_side_saver_of_one_table_writes_it_under_the_plain_key(tmp_path, kind):
    _trained_tables(tmp_path, kind, lambda label: str(tmp_path / label / "tables" / "t"))
    plain, wrapped = (
        tf.train.load_checkpoint(str(tmp_path / label / "tables" / "t")) for label in ("plain", "wrapped")
    )
    keys = set(plain.get_variable_to_shape_map())
    assert set(wrapped.get_variable_to_shape_map()) == keys == {"emb/embeddings" if kind == "side_list" else "pre/emb"}
    for key in keys:
        np.testing.assert_allclose(wrapped.get_tensor(key), plain.get_tensor(key), rtol=1e-6, atol=1e-7)


def test_pretrained_rows_restored_in_init_fn_by_a_saver_of_a_view(tmp_path):
    pretrained = np.arange(120, dtype=np.float32).reshape(30, 4) / 100.0
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        table = tf.compat.v1.get_variable("pre/emb", initializer=pretrained)
        session.run(table.initializer)
        tf.compat.v1.train.Saver({"pre/emb": table}).save(session, str(tmp_path / "pre" / "t"))
    values = _trained_tables(tmp_path, "init_fn", lambda label: str(tmp_path / "pre" / "t"))
    plain, wrapped = values["plain"].get_tensor("emb/embeddings"), values["wrapped"].get_tensor("emb/embeddings")
    np.testing.assert_allclose(wrapped, plain, rtol=1e-6, atol=1e-7)
    assert np.abs(plain - pretrained).max() < 0.2  # the pretrained rows, trained 3 steps
    np.testing.assert_allclose(
        values["wrapped"].get_tensor("emb2/embeddings"),
        values["plain"].get_tensor("emb2/embeddings"),
        rtol=1e-6,
        atol=1e-7,
    )


def test_a_users_checkpoint_saver_hook_saves_with_the_wrapped_model_fn(tmp_path):
    """A ``CheckpointSaverHook`` with no Saver finds the graph's (hybridtf's, in the plain layout), as it finds the
    Estimator's default one for the plain model_fn."""
    saved = {}
    for label, fn in (("plain", wdl_model_fn), ("wrapped", htf_estimator.model_fn(wdl_model_fn))):
        model_dir = str(tmp_path / label)

        class Listener(tf.estimator.CheckpointSaverListener):
            def __init__(self, steps):
                self.steps = steps

            def after_save(self, session, global_step_value):
                self.steps.append(int(global_step_value))

        listener = Listener(saved.setdefault(label, []))
        hook = tf.compat.v1.train.CheckpointSaverHook(model_dir, save_steps=5, listeners=[listener])
        tf.estimator.Estimator(fn, model_dir=model_dir, config=_config()).train(_input, steps=12, hooks=[hook])
    assert saved["wrapped"] == saved["plain"] and 5 in saved["plain"]
    plain, wrapped = (dict(tf.train.list_variables(str(tmp_path / d))) for d in ("plain", "wrapped"))
    assert wrapped == plain and "emb_C3/embeddings/Adagrad" in wrapped
    np.testing.assert_allclose(
        _evaluate(wdl_model_fn, tmp_path / "wrapped"), _evaluate(wdl_model_fn, tmp_path / "plain"), rtol=1e-5
    )
