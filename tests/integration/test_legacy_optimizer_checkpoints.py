"""``tf.keras.optimizers.legacy`` optimizers: packed tables' slots are checkpointed per table, as the plain model's.

A legacy optimizer saves slots through the object graph (``<table>/.OPTIMIZER_SLOT/optimizer/<slot>``); an
optimized model's graph holds the tables' views, which answer for their rows of the packed slots
(``integrations/keras_legacy_slots.py``). Resuming, plain <-> optimized transfer and optimizing a model whose
optimizer already trained it all continue exactly as the plain model does.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf

LEGACY = ("Adam", "Adagrad", "Ftrl")


def _model(optimized, kind):
    tf.keras.utils.set_random_seed(0)
    a, b = tf.keras.Input((1,), dtype="int64"), tf.keras.Input((1,), dtype="int64")
    parts = [tf.keras.layers.Flatten()(tf.keras.layers.Embedding(20, 4, name=n)(x)) for n, x in (("ea", a), ("eb", b))]
    out = tf.keras.layers.Dense(1, activation="sigmoid")(tf.keras.layers.Concatenate()(parts))
    model = tf.keras.Model([a, b], out)
    if optimized:
        model = htf.keras.optimize(model)
    model.compile(getattr(tf.keras.optimizers.legacy, kind)(0.05), "binary_crossentropy")
    return model


def _batches(n=10):
    rng = np.random.default_rng(0)
    return [
        ([rng.integers(0, 20, (32, 1)), rng.integers(0, 20, (32, 1))], rng.integers(0, 2, (32, 1)).astype("float32"))
        for _ in range(n)
    ]


def _slot_keys(path):
    return sorted(n for n, _ in tf.train.list_variables(path) if "OPTIMIZER_SLOT" in n)


@pytest.mark.parametrize("kind", LEGACY)
@pytest.mark.parametrize(
    "source, target", [(True, True), (False, True), (True, False)], ids=["opt-opt", "plain-opt", "opt-plain"]
)
def test_resumed_training_equals_uninterrupted(kind, source, target, tmp_path):
    batches = _batches()
    model = _model(source, kind)
    for x, y in batches[:5]:
        model.train_on_batch(x, y)
    model.save_weights(str(tmp_path / "ck"))
    expected = [model.train_on_batch(x, y) for x, y in batches[5:]]
    resumed = _model(target, kind)
    resumed.load_weights(str(tmp_path / "ck"))
    np.testing.assert_allclose([resumed.train_on_batch(x, y) for x, y in batches[5:]], expected, rtol=1e-6)


def test_checkpoint_keys_are_the_plain_models(tmp_path):
    keys = []
    for optimized in (False, True):
        model = _model(optimized, "Adam")
        x, y = _batches(1)[0]
        model.train_on_batch(x, y)
        tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(str(tmp_path / f"ck{optimized}"))
        keys.append(_slot_keys(str(tmp_path / f"ck{optimized}")))
    assert keys[0] == keys[1] and len(keys[0]) == 2 * 4  # m, v of two tables, the dense kernel and bias


def test_optimizing_a_trained_model_keeps_its_optimizer_state():
    batches = _batches()
    plain, wrapped = _model(False, "Adam"), _model(False, "Adam")
    for x, y in batches[:5]:
        plain.train_on_batch(x, y)
        wrapped.train_on_batch(x, y)
    wrapped = htf.keras.optimize(wrapped)
    wrapped.compile(wrapped.optimizer, "binary_crossentropy")
    expected = [plain.train_on_batch(x, y) for x, y in batches[5:]]
    np.testing.assert_allclose([wrapped.train_on_batch(x, y) for x, y in batches[5:]], expected, rtol=1e-6)


def test_restore_before_compile_keeps_the_slots(tmp_path):
    """A ``tf.train.Checkpoint`` restored into the optimizer before ``compile`` hooks it: the slots it restored for
    the tables' views are moved into the packed slots when ``compile`` hooks the optimizer."""
    batches = _batches()
    model = _model(True, "Adam")
    for x, y in batches[:5]:
        model.train_on_batch(x, y)
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(str(tmp_path / "ck"))
    expected = [model.train_on_batch(x, y) for x, y in batches[5:]]
    resumed = _model(True, "Adam")
    optimizer = tf.keras.optimizers.legacy.Adam(0.05)
    tf.train.Checkpoint(model=resumed, optimizer=optimizer).restore(path)
    resumed.compile(optimizer, "binary_crossentropy")
    np.testing.assert_allclose([resumed.train_on_batch(x, y) for x, y in batches[5:]], expected, rtol=1e-6)


# Tables in an htf.function step: the step's legacy optimizer is hooked after the step's first trace.
_INIT = np.random.default_rng(3).uniform(-0.1, 0.1, (20, 4)).astype("float32")


def _tables_step(kind, packed, sets=1):
    """A step over ``sets`` Tables sets (or plain variables) reached through helpers, with a legacy optimizer."""
    if packed:
        owners = [htf.embedding.Tables([htf.embedding.TableConfig("e", 20, 4, initializer=_INIT)]) for _ in range(sets)]
        looks = [lambda ids, t=t: t.lookup("e", ids) for t in owners]
        variables = [v for t in owners for v in t.trainable_variables]
        decorate = htf.function
    else:
        owners = [tf.Variable(_INIT) for _ in range(sets)]
        looks = [lambda ids, v=v: tf.nn.embedding_lookup(v, ids) for v in owners]
        variables, decorate = list(owners), tf.function
    optimizer = getattr(tf.keras.optimizers.legacy, kind[0])(**kind[1])

    @decorate
    def step(ids, y):
        with tf.GradientTape() as tape:
            pred = tf.add_n([tf.reduce_sum(look(ids), 1, keepdims=True) for look in looks])
            loss = tf.reduce_mean(tf.square(pred - y))
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    return owners, optimizer, step


def _tables_data(n=10):
    rng = np.random.default_rng(4)
    return [(tf.constant(rng.integers(0, 20, (12, 3))), tf.constant(rng.random((12, 1)), tf.float32)) for _ in range(n)]


@pytest.mark.parametrize(
    "kind",
    [
        ("Adam", {"learning_rate": 0.05}),
        ("Adagrad", {"learning_rate": 0.3}),
        ("SGD", {"learning_rate": 0.1, "momentum": 0.9}),
    ],
    ids=["adam", "adagrad", "sgd_momentum"],
)
@pytest.mark.parametrize("sets", [1, 2])
def test_tables_step_resumes_exactly_from_a_checkpoint(kind, sets, tmp_path):
    """Found by a probe: a ``tf.train.Checkpoint`` of Tables and a legacy optimizer held none of the tables' slots
    (Adam resumed 0.49 relative off, silently), and legacy ``SGD`` failed to trace (its momentum is a tensor).
    Restored into fresh objects before their first step, and into the running ones after more steps."""
    data = _tables_data()
    _, _, plain_step = _tables_step(kind, packed=False, sets=sets)
    plain = [float(plain_step(*batch)) for batch in data]
    owners, optimizer, step = _tables_step(kind, packed=True, sets=sets)
    losses = [float(step(*batch)) for batch in data[:5]]
    path = tf.train.Checkpoint(t=owners, opt=optimizer).save(str(tmp_path / "ck"))
    for batch in data[5:7]:  # trained on, then restored back to step 5
        step(*batch)
    tf.train.Checkpoint(t=owners, opt=optimizer).restore(path).assert_consumed()
    losses += [float(step(*batch)) for batch in data[5:]]
    np.testing.assert_allclose(losses, plain, rtol=1e-6)
    fresh_owners, fresh_optimizer, fresh_step = _tables_step(kind, packed=True, sets=sets)
    # the optimizer's own variables (iterations, hyperparameters) are created, and restored, at its first step
    tf.train.Checkpoint(t=fresh_owners, opt=fresh_optimizer).restore(path).assert_existing_objects_matched()
    np.testing.assert_allclose([float(fresh_step(*batch)) for batch in data[5:]], plain[5:], rtol=1e-6)
    assert not any("hybridtf_table" in key for key in fresh_optimizer._slots)  # the views' restored slots moved in
