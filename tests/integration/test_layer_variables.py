"""``htf.keras.layer_variables``: per-layer optimizers (Wide & Deep's FTRL + Adagrad) on an optimized model.

A packed Embedding's own ``trainable_variables`` is empty (its rows live in the
packed variable), so a custom ``train_step`` that splits the variables by layer
collects them with ``layer_variables``: the same training as the plain model's
split, and an error naming the fix when a packed variable straddles the split.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf

L = tf.keras.layers
FIELDS, VOCAB, BATCH = 4, 50, 32


class TwoOptimizers(tf.keras.Model):
    """FTRL for the wide layers' variables, the compiled optimizer for the rest."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compiled_loss(y, self(x, training=True))
        wide = htf.keras.layer_variables(self, self.wide_layers)
        deep = [v for v in self.trainable_variables if all(v is not w for w in wide)]
        wide_grads, deep_grads = tape.gradient(loss, [wide, deep])
        self.wide_optimizer.apply_gradients(zip(wide_grads, wide))
        self.optimizer.apply_gradients(zip(deep_grads, deep))
        return {"loss": loss}


class TwoOptimizersByName(tf.keras.Model):
    """The same split by variable name, as a user without ``layer_variables`` writes it."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compiled_loss(y, self(x, training=True))
        wide = [v for v in self.trainable_variables if "wide" in v.name]
        deep = [v for v in self.trainable_variables if "wide" not in v.name]
        wide_grads, deep_grads = tape.gradient(loss, [wide, deep])
        self.wide_optimizer.apply_gradients(zip(wide_grads, wide))
        self.optimizer.apply_gradients(zip(deep_grads, deep))
        return {"loss": loss}


def _wide_and_deep(wide_dim=1, optimize=False, model_class=TwoOptimizers, **optimize_kwargs):
    tf.keras.utils.set_random_seed(4)
    inputs = [tf.keras.Input((1,), dtype=tf.int64, name=f"f{i}") for i in range(FIELDS)]
    wide_layers = [L.Embedding(VOCAB, wide_dim, name=f"wide{i}") for i in range(FIELDS)]
    deep_layers = [L.Embedding(VOCAB, 4, name=f"deep{i}") for i in range(FIELDS)]
    wide = L.Dense(1, use_bias=False)(L.Concatenate()([L.Flatten()(w(x)) for w, x in zip(wide_layers, inputs)]))
    deep = L.Concatenate()([L.Flatten()(d(x)) for d, x in zip(deep_layers, inputs)])
    logit = L.Add()([wide, L.Dense(1)(L.Dense(8, "relu")(deep))])
    model = model_class(inputs, L.Activation("sigmoid")(logit))
    if optimize:
        model = htf.keras.optimize(model, **optimize_kwargs)
    model.wide_layers = [model.get_layer(f"wide{i}") for i in range(FIELDS)]
    model.wide_optimizer = tf.keras.optimizers.Ftrl(0.1)
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    return model


def _batches(steps=12):
    rng = np.random.default_rng(0)
    return [
        (
            {f"f{i}": tf.constant(rng.integers(0, VOCAB, (BATCH, 1))) for i in range(FIELDS)},
            tf.constant(rng.integers(0, 2, (BATCH, 1)).astype(np.float32)),
        )
        for _ in range(steps)
    ]


def _train(model, batches):
    return np.array([model.train_on_batch(x, y) for x, y in batches])


def test_two_optimizers_split_by_layer_train_as_the_plain_model():
    batches = _batches()
    plain = _wide_and_deep()
    packed = _wide_and_deep(optimize=True)
    assert packed.hybridtf_skipped == [] and len(packed.hybridtf_plan.packed_tables) == 2  # dims 1 and 4
    wide = htf.keras.layer_variables(packed, packed.wide_layers)
    assert len(wide) == 1 and wide[0].shape.as_list() == [FIELDS * VOCAB, 1]  # the wide packed table, once
    assert all(layer.trainable_variables == [] for layer in packed.wide_layers)  # why the helper exists
    np.testing.assert_allclose(_train(packed, batches), _train(plain, batches), rtol=1e-5, atol=0)


def test_two_optimizers_split_by_variable_name_train_as_the_plain_model():
    """Each packed variable is named under its tables' shared prefix (``wide/packed_1d_float32_model/embeddings``)."""
    batches = _batches()
    plain = _wide_and_deep(model_class=TwoOptimizersByName)
    packed = _wide_and_deep(optimize=True, model_class=TwoOptimizersByName)
    names = sorted(v.name for v in packed._htf_runtime.storage.packed.values())
    assert names == ["deep/packed_4d_float32_model/embeddings:0", "wide/packed_1d_float32_model/embeddings:0"]
    np.testing.assert_allclose(_train(packed, batches), _train(plain, batches), rtol=1e-5, atol=0)


def test_a_packed_variable_across_the_split_is_an_error_until_packed_apart():
    batches = _batches()
    with pytest.raises(ValueError, match=r"packed in .* with the tables of layers \['deep0'.*force_groups"):
        _train(_wide_and_deep(wide_dim=4, optimize=True), batches)
    plain = _wide_and_deep(wide_dim=4)
    groups = {"wide": [f"wide{i}" for i in range(FIELDS)], "deep": [f"deep{i}" for i in range(FIELDS)]}
    apart = _wide_and_deep(wide_dim=4, optimize=True, force_groups=groups)
    np.testing.assert_allclose(_train(apart, batches), _train(plain, batches), rtol=1e-5, atol=0)


def test_plain_models_sub_models_and_dynamic_groups():
    model = _wide_and_deep()
    assert htf.keras.layer_variables(model, model.get_layer("deep0")) == model.get_layer("deep0").trainable_variables
    inner_in = tf.keras.Input((1,), dtype=tf.int64)
    tower = tf.keras.Model(inner_in, L.Dense(2)(L.Flatten()(L.Embedding(VOCAB, 4)(inner_in))), name="tower")
    outer_in = tf.keras.Input((1,), dtype=tf.int64)
    outer = htf.keras.optimize(tf.keras.Model(outer_in, L.Dense(1)(tower(outer_in))))
    variables = htf.keras.layer_variables(outer, [tower])
    assert sorted(v.shape.as_list() for v in variables) == [[2], [4, 2], [VOCAB, 4]]  # Dense + packed table

    ins = [tf.keras.Input((1,), dtype=tf.int64, name=f"f{i}") for i in range(2)]
    dyn = [htf.layers.DynamicEmbedding(4, hot_rows=10, name=f"d{i}") for i in range(2)]
    packed = htf.keras.optimize(
        tf.keras.Model(ins, L.Dense(1)(L.Concatenate()([L.Flatten()(d(x)) for d, x in zip(dyn, ins)])))
    )
    layers = [packed.get_layer("d0"), packed.get_layer("d1")]
    assert len(htf.keras.layer_variables(packed, layers)) == 1  # the group's distinct-rows buffer, once
    with pytest.raises(ValueError, match=r"\['d1'\]"):
        htf.keras.layer_variables(packed, layers[:1])
    with pytest.raises(TypeError, match="takes Keras layers"):
        htf.keras.layer_variables(packed, ["d0"])


def test_user_code_reading_a_packed_layers_variables_is_told_once(caplog):
    model = _wide_and_deep(optimize=True)
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        assert model.trainable_variables  # the framework's own reads: no warning
        assert htf.keras.layer_variables(model, model.wide_layers)
        assert not [r for r in caplog.records if "layer_variables" in r.getMessage()]
        assert model.get_layer("wide0").trainable_variables == []
        assert model.get_layer("deep1").trainable_variables == []
    told = [r.getMessage() for r in caplog.records if "layer_variables" in r.getMessage()]
    assert len(told) == 1 and "'wide0' is packed" in told[0] and "packed_1d" in told[0]


def test_model_weights_and_variables_hold_the_packed_tables():
    """``model.weights`` / ``variables`` (``count_params``, an EMA over ``model.variables``) list the packed
    variables: no layer of the optimized model holds them among its own weights."""
    plain = _wide_and_deep()
    optimized = _wide_and_deep(optimize=True)
    assert optimized.count_params() == plain.count_params()
    # summary()'s Param # per layer: a packed layer counts its table's rows as the plain layer does
    assert [layer.count_params() for layer in optimized.layers] == [layer.count_params() for layer in plain.layers]
    assert optimized.get_layer("deep1").count_params() == VOCAB * 4
    packed = list(optimized._htf_runtime.storage.packed.values())
    for weights in (optimized.weights, optimized.variables, optimized.trainable_weights):
        assert all(any(w is p for w in weights) for p in packed)
        assert len({id(w) for w in weights}) == len(weights)  # each once
    paths, plain_paths = optimized.get_weight_paths(), plain.get_weight_paths()
    tables = sorted(k for k in plain_paths if k.endswith(".embeddings"))  # (the Dense layers' names differ)
    assert len(tables) == 2 * FIELDS and sorted(k for k in paths if k.endswith(".embeddings")) == tables
    assert len(paths) == len(plain_paths)  # each table at its plain path (its view of the packed rows)
    np.testing.assert_array_equal(np.asarray(paths["deep2.embeddings"]), plain_paths["deep2.embeddings"].numpy())
    ema = tf.train.ExponentialMovingAverage(0.9)
    ema.apply(optimized.variables)
    assert all(ema.average(p) is not None for p in packed)


@pytest.mark.parametrize("source, target", [(False, True), (True, False)], ids=["plain-opt", "opt-plain"])
def test_the_train_steps_own_optimizer_checkpoints_in_the_plain_layout(source, target, tmp_path):
    """``model.wide_optimizer`` is hooked at ``compile`` as the compiled one: its state moves plain <-> optimized."""
    batches = _batches()
    model = _wide_and_deep(optimize=source)
    _train(model, batches[:6])
    model.save_weights(str(tmp_path / "ck"))
    expected = _train(model, batches[6:])
    resumed = _wide_and_deep(optimize=target)
    resumed.load_weights(str(tmp_path / "ck"))
    np.testing.assert_allclose(_train(resumed, batches[6:]), expected, rtol=1e-5, atol=0)


@pytest.mark.parametrize("optimized", [False, True], ids=["plain", "optimized"])
def test_a_keras_weights_file_of_a_two_optimizer_step_loads_as_into_the_plain_model(optimized, tmp_path, caplog):
    """The compiled optimizer trains only the deep variables: a build over all of them would not fit the file, so
    ``load_weights`` leaves it unbuilt and its state is skipped with a warning, as Keras skips it in the plain model
    (it was refused, and the weights could not be loaded at all); the model's weights load exactly."""
    batches = _batches(8)
    model = _wide_and_deep(optimize=optimized)
    _train(model, batches[:4])
    path = str(tmp_path / "two.weights.h5")
    model.save_weights(path)
    resumed = _wide_and_deep(optimize=optimized)
    with caplog.at_level(logging.WARNING):
        resumed.load_weights(path)
    x = batches[4][0]
    np.testing.assert_array_equal(resumed.predict_on_batch(x), model.predict_on_batch(x))
    if optimized:
        told = [r.getMessage() for r in caplog.records if "not loading the state of optimizer" in r.getMessage()]
        assert len(told) == 2 and "starts afresh" in told[0]  # the compiled Adagrad and the step's own Ftrl
    assert np.isfinite(_train(resumed, batches[4:])).all()


class TwoTowers(tf.keras.Model):
    """A two-tower model whose ``train_step`` trains each tower (a sub-model) with its own optimizer."""

    def __init__(self, split_by_layer):
        super().__init__()
        self.split_by_layer = split_by_layer
        self.towers = []
        for name in ("user", "item"):
            ids = tf.keras.Input((1,), dtype=tf.int64)
            out = L.Dense(4)(L.Flatten()(L.Embedding(VOCAB, 4, name=f"{name}_emb")(ids)))
            self.towers.append(tf.keras.Model(ids, out, name=f"{name}_tower"))

    def call(self, x):
        user, item = self.towers[0](x["f0"]), self.towers[1](x["f1"])
        return tf.sigmoid(tf.reduce_sum(user * item, axis=1, keepdims=True))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compiled_loss(y, self(x, training=True))
        if self.split_by_layer:
            user = htf.keras.layer_variables(self, [self.towers[0]])
            item = [v for v in self.trainable_variables if all(v is not u for u in user)]
        else:
            user, item = self.towers[0].trainable_variables, self.towers[1].trainable_variables
        user_grads, item_grads = tape.gradient(loss, [user, item])
        self.optimizer.apply_gradients(zip(user_grads, user))
        self.item_optimizer.apply_gradients(zip(item_grads, item))
        return {"loss": loss}


@pytest.mark.parametrize("split_by_layer", [False, True], ids=["sub-models", "layer_variables"])
def test_a_fit_train_step_splitting_its_sub_models_among_two_optimizers_is_told(split_by_layer, caplog):
    """The towers' own ``trainable_variables`` hold no packed table: such a split leaves the tables untrained, which
    ``fit`` must not do silently (found by a probe: a two-tower model's tables stayed at their initial rows)."""
    tf.keras.utils.set_random_seed(5)
    model = TwoTowers(split_by_layer)
    batches = _batches(2)
    model(batches[0][0])
    model = htf.keras.optimize(model, force_groups={"u": ["user_emb"], "i": ["item_emb"]})
    model.item_optimizer = tf.keras.optimizers.Adam(0.01)
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    with caplog.at_level(logging.WARNING, logger="hybridtf"):
        _train(model, batches)
    told = [r.getMessage() for r in caplog.records if "trained with 2 optimizers" in r.getMessage()]
    if split_by_layer:
        assert told == []
    else:
        assert len(told) == 1 and "a sub-model's (a tower's) trainable_variables hold none" in told[0], told
        assert "layer_variables(model, layers)" in told[0] and "user_emb" in told[0]
