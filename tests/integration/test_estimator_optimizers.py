"""hybridtf.estimator: a model_fn that trains its tables with two optimizers, picking their variables by scope or name.

The TF1 way to train Wide & Deep: FTRL for the variables of scope ``wide``, Adagrad for those of ``deep``. Tables
updated by different optimizers are packed apart, and each packed variable is named in its tables' shared scope, so
the same filters pick it; a split the packed variables cannot follow raises instead of training a table wrongly.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

import hybridtf.estimator as htf_estimator
from hybridtf._src.capture.context import CaptureError
from tests.integration.test_estimator import FIELDS, LOSS_KEY, VOCAB, _assert_losses_close, _graph_spec, _init, _train

TRAINABLE = tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES


def _scope_vars(scope):
    return tf.compat.v1.get_collection(TRAINABLE, scope=scope)


def _name_vars(part):
    return [v for v in tf.compat.v1.trainable_variables() if part in v.name]


SPLITS = {
    "scope": _scope_vars,  # get_collection(TRAINABLE_VARIABLES, scope=...)
    "name": _name_vars,  # "wide" in v.name
}


def make_model_fn(split):
    def model_fn(features, labels, mode):
        deep, wide = [], []
        for i in range(FIELDS):
            ids = features[f"C{i}"]
            with tf.compat.v1.variable_scope("deep"):  # re-entered: Keras names the scopes deep, deep_1, ...
                deep.append(tf.keras.layers.Embedding(VOCAB - i, 4, embeddings_initializer=_init(i), name=f"d{i}")(ids))
            with tf.compat.v1.variable_scope("wide"):
                wide.append(
                    tf.keras.layers.Embedding(VOCAB - i, 4, embeddings_initializer=_init(50 + i), name=f"w{i}")(ids)
                )
        with tf.compat.v1.variable_scope("deep"):
            hidden = tf.keras.layers.Dense(8, "relu", kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1))
            logit = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=2))(
                hidden(tf.concat(deep, axis=1))
            )
        logit += tf.reduce_sum(tf.add_n(wide), axis=1, keepdims=True)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logit))
        tf.compat.v1.add_to_collection(LOSS_KEY, loss)
        step = tf.compat.v1.train.get_global_step()
        wide_op = tf.compat.v1.train.FtrlOptimizer(0.1).minimize(loss, var_list=split("wide"))
        deep_op = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, var_list=split("deep"), global_step=step)
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf.group(wide_op, deep_op))

    return model_fn


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_tables_of_two_optimizers_chosen_by_scope_or_name_train_as_plain(tmp_path, split):
    fn = make_model_fn(SPLITS[split])
    hooks = htf_estimator.hooks(every_n_steps=None, log_fn=lambda line: None)
    _, plain = _train(fn, tmp_path / "plain", 30)
    wrapped_est, wrapped = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 30, hooks)
    _assert_losses_close(wrapped, plain)
    groups = {pt.name: sorted(m.name for m in pt.members) for pt in hooks[0].report.plan.packed_tables}
    # The same dim, two optimizers: two packed tables.
    assert sorted(groups.values()) == [[f"d{i}" for i in range(FIELDS)], [f"w{i}" for i in range(FIELDS)]]
    plain_keys = dict(tf.train.list_variables(str(tmp_path / "plain")))
    assert dict(tf.train.list_variables(wrapped_est.model_dir)) == plain_keys  # Ftrl and Adagrad slots per table
    assert "wide/w0/embeddings/Ftrl" in plain_keys and "deep/d0/embeddings/Adagrad" in plain_keys


def _d0_with_wide(part):
    """The wide variables and table d0 for FTRL, the other deep variables for Adagrad (by name)."""
    if part == "wide":
        return _name_vars("wide") + [v for v in tf.compat.v1.trainable_variables() if v.name.startswith("deep/d0/")]
    return [v for v in _name_vars("deep") if not v.name.startswith("deep/d0/")]


def test_a_model_fn_that_fails_with_the_packed_variables_names_the_fix():
    """Table d0 goes with the wide tables to FTRL: packed with them, under no scope a name filter finds."""
    with pytest.raises(CaptureError, match=r"No variables to optimize.*packed.*exclude="):
        _graph_spec(htf_estimator.model_fn(make_model_fn(_d0_with_wide)))


def test_a_split_the_packed_variables_cannot_follow_raises():
    """Adagrad gets the deep tables by their layer names, which no packed variable carries."""

    def split(part):
        if part == "wide":
            return _name_vars("wide")
        deep = {f"d{i}" for i in range(FIELDS)}
        return [v for v in tf.compat.v1.trainable_variables() if v.name.split("/")[-2] in deep] + _name_vars("dense")

    with pytest.raises(CaptureError, match=r"updates with no optimizer.*Adagrad.*exclude=\['d0'"):
        _graph_spec(htf_estimator.model_fn(make_model_fn(split)))


def test_a_loss_term_over_tables_picked_by_name_raises_naming_that_cause():
    """An L2 over the variables named "embeddings" (none packed carries it): one optimizer, another kind of update."""

    def model_fn(features, labels, mode):
        embedded = [
            tf.keras.layers.Embedding(VOCAB, 4, embeddings_initializer=_init(i), name=f"e{i}")(features[f"C{i}"])
            for i in range(FIELDS)
        ]
        logit = tf.keras.layers.Dense(1)(tf.concat(embedded, axis=1))
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logit))
        penalties = [tf.nn.l2_loss(v) for v in tf.compat.v1.trainable_variables() if "embeddings" in v.name]
        if penalties:  # none in the real pass: the packed variable has another name
            loss += 1e-3 * tf.add_n(penalties)
        step = tf.compat.v1.train.get_global_step()
        return tf.estimator.EstimatorSpec(
            mode, loss=loss, train_op=tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, step)
        )

    with pytest.raises(CaptureError, match=r"another kind of gradient.*picked by name"):
        _graph_spec(htf_estimator.model_fn(model_fn))


def _scaled_model_fn(picked):
    """SGD over every variable; the gradients of the variables ``picked(v)`` selects are scaled by 20 first."""

    def model_fn(features, labels, mode):
        deep = []
        for i in range(FIELDS):
            with tf.compat.v1.variable_scope("deep"):
                layer = tf.keras.layers.Embedding(VOCAB - i, 4, embeddings_initializer=_init(i), name=f"d{i}")
                deep.append(layer(features[f"C{i}"]))
        dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=2))
        logit = dense(tf.concat(deep, axis=1))
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logit))
        tf.compat.v1.add_to_collection(LOSS_KEY, loss)
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.5)

        def scale(g):
            if isinstance(g, tf.IndexedSlices):
                return tf.IndexedSlices(g.values * 20.0, g.indices, g.dense_shape)
            return g * 20.0

        scaled = [(scale(g) if picked(v) else g, v) for g, v in opt.compute_gradients(loss)]
        train_op = opt.apply_gradients(scaled, global_step=tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn


def test_gradients_scaled_for_tables_picked_by_their_scope_train_as_plain(tmp_path):
    """The packed variable is named under the tables' shared scope (deep), so the same filter scales its gradient."""
    fn = _scaled_model_fn(lambda v: v.name.startswith("deep"))  # deep/d0, deep_1/d1, ...
    _, plain = _train(fn, tmp_path / "plain", 20)
    _, unscaled = _train(_scaled_model_fn(lambda v: False), tmp_path / "unscaled", 20)
    assert abs(plain - unscaled).max() > 1e-3  # the scaling changes training (100x the tolerance)
    _, wrapped = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 20)
    _assert_losses_close(wrapped, plain)


def test_gradients_scaled_for_tables_picked_by_layer_name_raise_naming_that_cause():
    """Only the tables' own names say ``/d3/``-like layer names: no packed variable carries them, and the packed
    variable's gradient would silently go unscaled."""
    fn = _scaled_model_fn(lambda v: v.name.split("/")[-2] in {f"d{i}" for i in range(FIELDS)})
    with pytest.raises(
        CaptureError, match=r"other ops to the gradient before the update: Mul for the table, nothing for the packed"
    ):
        _graph_spec(htf_estimator.model_fn(fn))


def test_a_global_norm_clip_over_all_gradients_is_not_mistaken_for_a_transform_picked_by_name():
    """``tf.clip_by_global_norm`` reads every gradient (one L2Loss per variable: fewer once packed)."""

    def model_fn(features, labels, mode):
        embedded = [
            tf.keras.layers.Embedding(VOCAB, 4, embeddings_initializer=_init(i), name=f"e{i}")(features[f"C{i}"])
            for i in range(FIELDS)
        ]
        logit = tf.keras.layers.Dense(1)(tf.concat(embedded, axis=1))
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logit))
        opt = tf.compat.v1.train.AdagradOptimizer(0.1)
        grads, variables = zip(*opt.compute_gradients(loss))
        grads, _ = tf.clip_by_global_norm(grads, 1.0)
        train_op = opt.apply_gradients(zip(grads, variables), global_step=tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    _, spec, report = _graph_spec(htf_estimator.model_fn(model_fn))
    assert spec.train_op is not None and len(report.plan.packed_tables) == 1
