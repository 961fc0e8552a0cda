"""hybridtf.estimator: a model_fn that trains its tables with two optimizers, picking their variables by scope or name.

The TF1 way to train Wide & Deep: FTRL for the variables of scope ``wide``, Adagrad for those of ``deep``. Tables
updated by different optimizers are packed apart, and each packed variable is named in its tables' shared scope, so
the same filters pick it; a split the packed variables cannot follow raises instead of training a table wrongly.
"""

from __future__ import annotations

import contextlib
import logging

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


def _one_layer_loss(features, labels):
    """The loss of a logistic regression over tables e0, e1, ... (dim 4)."""
    embedded = [
        tf.keras.layers.Embedding(VOCAB, 4, embeddings_initializer=_init(i), name=f"e{i}")(features[f"C{i}"])
        for i in range(FIELDS)
    ]
    dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=3))
    logit = dense(tf.concat(embedded, axis=1))
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logit))


def _l2_by_name_model_fn(features, labels, mode):
    """One optimizer; the loss adds an L2 over the variables named "embeddings" (its tables)."""
    loss = _one_layer_loss(features, labels)
    penalties = [tf.nn.l2_loss(v) for v in tf.compat.v1.trainable_variables() if "embeddings" in v.name]
    loss += 1e-3 * tf.add_n(penalties)
    tf.compat.v1.add_to_collection(LOSS_KEY, loss)
    step = tf.compat.v1.train.get_global_step()
    train_op = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_a_loss_term_over_tables_picked_by_name_trains_as_plain(tmp_path):
    """The packed variable ends in /embeddings as its tables do: an L2 over the variables picked by
    ``"embeddings" in v.name`` covers it (it covered no packed table and was refused before)."""
    _, plain = _train(_l2_by_name_model_fn, tmp_path / "plain", 20)
    hooks = htf_estimator.hooks(every_n_steps=None, log_fn=lambda line: None)
    est, wrapped = _train(htf_estimator.model_fn(_l2_by_name_model_fn), tmp_path / "wrapped", 20, hooks)
    _assert_losses_close(wrapped, plain)
    assert [len(pt.members) for pt in hooks[0].report.plan.packed_tables] == [FIELDS]
    assert dict(tf.train.list_variables(est.model_dir)) == dict(tf.train.list_variables(str(tmp_path / "plain")))


def _scaled_model_fn(picked, optimizer="sgd", scope=None, in_cond=False):
    """One optimizer over every variable; the gradient of each variable ``picked(v, layers)`` selects is multiplied
    by the factor it returns first (True: 20; ``layers``: the embedding layers).

    Args:
        optimizer: "sgd" or "adam" (its sparse update scatters the gradient into its slots, then reads them).
        scope: a name scope around the optimizer's ops (the user's multiplications are in it too).
        in_cond: the update inside a ``tf.cond`` (skipped unless every gradient is finite).
    """

    def model_fn(features, labels, mode):
        deep, layers = [], []
        for table_scope, fields in (("deep", range(FIELDS // 2)), ("deeper", range(FIELDS // 2, FIELDS))):
            with tf.compat.v1.variable_scope(table_scope):  # entered once: deep/d0 ... deep/d3, deeper/d4 ...
                for i in fields:
                    layers.append(
                        tf.keras.layers.Embedding(VOCAB - i, 4, embeddings_initializer=_init(i), name=f"d{i}")
                    )
                    deep.append(layers[-1](features[f"C{i}"]))
        dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=2))
        logit = dense(tf.concat(deep, axis=1))
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logit))
        tf.compat.v1.add_to_collection(LOSS_KEY, loss)
        with tf.name_scope(scope) if scope else contextlib.nullcontext():
            if optimizer == "adam":
                opt = tf.compat.v1.train.AdamOptimizer(0.01)
            else:
                opt = tf.compat.v1.train.GradientDescentOptimizer(0.5)

            def scale(g, factor):
                if isinstance(g, tf.IndexedSlices):
                    return tf.IndexedSlices(g.values * factor, g.indices, g.dense_shape)
                return g * factor

            scaled = []
            for g, v in opt.compute_gradients(loss):
                factor = picked(v, layers)
                scaled.append((scale(g, 20.0 if factor is True else factor) if factor else g, v))
            step = tf.compat.v1.train.get_global_step()
            if not in_cond:
                return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=opt.apply_gradients(scaled, step))
            finite = tf.reduce_all(
                [
                    tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g))
                    for g, _ in scaled
                ]
            )
            update = tf.cond(finite, lambda: opt.apply_gradients(scaled), tf.no_op)
            with tf.control_dependencies([update]):
                return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=step.assign_add(1))

    return model_fn


def test_gradients_scaled_for_tables_picked_by_their_scope_train_as_plain(tmp_path):
    """The packed variable is named under the tables' shared scope (deep), so the same filter scales its gradient."""
    fn = _scaled_model_fn(lambda v, layers: v.name.startswith("deep"))  # deep/d0, ..., deeper/d4, ...
    _, plain = _train(fn, tmp_path / "plain", 20)
    _, unscaled = _train(_scaled_model_fn(lambda v, layers: False), tmp_path / "unscaled", 20)
    assert abs(plain - unscaled).max() > 1e-3  # the scaling changes training (100x the tolerance)
    _, wrapped = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 20)
    _assert_losses_close(wrapped, plain)


def _by_layer_name(v, layers):
    return v.name.split("/")[-2] in {f"d{i}" for i in range(FIELDS)}


def test_gradients_scaled_for_tables_picked_by_layer_name_raise_naming_that_cause():
    """Only the tables' own names say ``/d3/``-like layer names: no packed variable carries them, and the packed
    variable's gradient would silently go unscaled."""
    fn = _scaled_model_fn(_by_layer_name)
    with pytest.raises(
        CaptureError,
        match=r"other ops to the gradient before the update: Mul\(20.0\) for the table, nothing for the packed",
    ):
        _graph_spec(htf_estimator.model_fn(fn))


@pytest.mark.parametrize(
    "where",
    [
        dict(optimizer="adam"),  # the scaled gradient reaches the table through Adam's slots
        dict(scope="train"),  # the user's multiplications inside the optimizer's name scope
        dict(in_cond=True),  # the update inside a tf.cond's branch
    ],
    ids=["adam_slots", "name_scope", "cond"],
)
def test_a_missed_scaling_is_found_wherever_the_update_reads_the_gradient(where):
    with pytest.raises(CaptureError, match=r"Mul\(20.0\) for the table, nothing for the packed"):
        _graph_spec(htf_estimator.model_fn(_scaled_model_fn(_by_layer_name, **where)))


@pytest.mark.parametrize("picked", ["scope", "layer"])
def test_other_multipliers_per_scope_or_per_layer_pack_apart_and_train_as_plain(tmp_path, picked):
    """x2 for the tables of scope deep, x0.5 for those of deeper: the constants tell the transforms apart, so the
    tables are packed apart (each packed variable under its scope, and each layer's variables its own)."""
    if picked == "scope":

        def factor(v, layers):
            return 2.0 if v.name.startswith("deep/") else 0.5 if v.name.startswith("deeper/") else 0

    else:

        def factor(v, layers):  # keyed by the layers' own variables (a packed layer gives its packed variable)
            factors = {}
            for i, layer in enumerate(layers):
                factors.update({w.ref(): 2.0 if i < FIELDS // 2 else 0.5 for w in layer.trainable_variables})
            return factors.get(v.ref(), 0)

    fn = _scaled_model_fn(factor)
    _, plain = _train(fn, tmp_path / "plain", 20)
    hooks = htf_estimator.hooks(every_n_steps=None, log_fn=lambda line: None)
    _, wrapped = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 20, hooks)
    _assert_losses_close(wrapped, plain)
    assert len(hooks[0].report.plan.packed_tables) == 2


def test_a_global_norm_clip_over_all_gradients_is_not_mistaken_for_a_transform_picked_by_name(caplog):
    """``tf.clip_by_global_norm`` reads every gradient (one L2Loss per variable: fewer once packed)."""

    def model_fn(features, labels, mode):
        loss = _one_layer_loss(features, labels)
        opt = tf.compat.v1.train.AdagradOptimizer(0.1)
        grads, variables = zip(*opt.compute_gradients(loss))
        grads, _ = tf.clip_by_global_norm(grads, 1.0)
        train_op = opt.apply_gradients(zip(grads, variables), global_step=tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        _, spec, report = _graph_spec(htf_estimator.model_fn(model_fn))
    assert spec.train_op is not None and len(report.plan.packed_tables) == 1
    # the packed gradient has summed distinct rows: once the clip acts the math differs, which is said
    assert "clips the gradients of packed tables ['e0', 'e1'" in caplog.text and "exclude=" in caplog.text


def _one_optimizer_model_fn(make_optimizer, lookups_per_table=1):
    def model_fn(features, labels, mode):
        tables = [
            tf.keras.layers.Embedding(VOCAB - i, 4, embeddings_initializer=_init(i), name=f"e{i}")
            for i in range(FIELDS)
        ]
        # lookups_per_table=2 reads every table with two id tensors (two gathers, one gradient per lookup)
        parts = [
            t(features[f"C{(i + k) % FIELDS}"] % (VOCAB - i))
            for k in range(lookups_per_table)
            for i, t in enumerate(tables)
        ]
        logit = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=2))(
            tf.concat(parts, axis=1)
        )
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logit))
        tf.compat.v1.add_to_collection(LOSS_KEY, loss)
        train_op = make_optimizer().minimize(loss, global_step=tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn


TF1_OPTIMIZERS = {
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.01),
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.05, 0.9),
    "ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.01),
}


def _update_uniques(graph):
    return [op.name for op in graph.get_operations() if op.type == "Unique" and "/update_" in op.name]


@pytest.mark.parametrize("optimizer", sorted(TF1_OPTIMIZERS))
def test_tf1_sparse_updates_of_packed_rows_skip_the_duplicate_summing_and_train_as_plain(tmp_path, optimizer):
    # A packed chain's gradient has one row per distinct id: the TF1 optimizer's Unique + segment sum over
    # repeated indices is left out, as it would change nothing; the plain model_fn keeps one per table.
    fn = _one_optimizer_model_fn(TF1_OPTIMIZERS[optimizer])
    plain_graph, _, _ = _graph_spec(fn)
    wrapped_graph, _, _ = _graph_spec(htf_estimator.model_fn(fn))
    assert len(_update_uniques(plain_graph)) == FIELDS
    assert _update_uniques(wrapped_graph) == []
    _, plain = _train(fn, tmp_path / "plain", 30)
    _, wrapped = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 30)
    _assert_losses_close(wrapped, plain)


def test_packed_rows_of_two_lookups_of_a_table_are_still_summed_and_train_as_plain(tmp_path):
    fn = _one_optimizer_model_fn(TF1_OPTIMIZERS["adagrad"], lookups_per_table=2)
    _, plain = _train(fn, tmp_path / "plain", 30)
    _, wrapped = _train(htf_estimator.model_fn(fn), tmp_path / "wrapped", 30)
    _assert_losses_close(wrapped, plain)


def test_distinct_by_construction_is_only_a_unique_ops_distinct_ids():
    from hybridtf._src.integrations.estimator_updates import distinct_by_construction
    from hybridtf._src.run.unique_partition import unique_partition

    with tf.Graph().as_default():
        ids = tf.constant([3, 1, 3, 2], tf.int64)
        unique = unique_partition(ids, num_partitions=1)
        assert distinct_by_construction(unique.unique_ids)
        assert distinct_by_construction(tf.identity(tf.identity(unique.unique_ids)))
        assert not distinct_by_construction(ids)
        assert not distinct_by_construction(tf.concat([unique.unique_ids, unique.unique_ids], 0))
        assert not distinct_by_construction(unique.inverse)


@pytest.mark.parametrize("make_optimizer", [tf.keras.optimizers.Adagrad, tf.keras.optimizers.legacy.Adagrad])
def test_a_keras_optimizers_slots_are_not_reported_as_lookups_hybridtf_does_not_manage(caplog, make_optimizer):
    """A Keras optimizer's sparse update gathers from its slot variables: they are not the model's lookups."""

    def model_fn(features, labels, mode):
        emb = tf.keras.layers.Embedding(VOCAB, 4, embeddings_initializer=_init(0), name="e0")
        dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=2))
        logit = dense(emb(features["C0"]))
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logit))
        tf.compat.v1.add_to_collection(LOSS_KEY, loss)
        variables = emb.trainable_variables + dense.trainable_variables
        train_op = make_optimizer(0.1).apply_gradients(zip(tf.gradients(loss, variables), variables))
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    with caplog.at_level("WARNING", logger="hybridtf"):
        _, _, report = _graph_spec(htf_estimator.model_fn(model_fn))
    assert [m.name for pt in report.plan.packed_tables for m in pt.members] == ["e0"]
    assert report.unpacked_lookups == []
    assert "does not manage" not in caplog.text
