"""Tables that get no gradient in a step keep their rows, packed or not (``keras_kept_rows``).

Keras skips a variable without gradient. Packed with a table that has one, a table whose lookups do not reach
the loss (a head compiled with ``loss=None``, a lookup under ``tf.stop_gradient``) used to be changed by
optimizers that update every row of a variable: weight decay decayed it, Keras's FTRL zeroed it.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf

B, STEPS = 32, 6


def _data():
    rng = np.random.default_rng(0)
    n = B * STEPS
    x = {"a": rng.integers(0, 20, (n, 1)), "b": rng.integers(0, 30, (n, 1))}
    return x, rng.integers(0, 2, (n, 1)).astype("float32")


def _model(variant):
    tf.keras.utils.set_random_seed(0)
    ia = tf.keras.Input((1,), dtype="int64", name="a")
    ib = tf.keras.Input((1,), dtype="int64", name="b")
    ea = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(20, 4, name="ea")(ia))
    eb = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(30, 4, name="eb")(ib))
    if variant == "loss_none_head":
        heads = [tf.keras.layers.Dense(1, "sigmoid", name=n)(e) for n, e in (("ctr", ea), ("aux", eb))]
        return tf.keras.Model([ia, ib], heads)
    frozen = tf.keras.layers.Lambda(tf.stop_gradient)(eb)
    out = tf.keras.layers.Dense(1, "sigmoid", name="ctr")(tf.keras.layers.Concatenate()([ea, frozen]))
    return tf.keras.Model([ia, ib], out)


OPTIMIZERS = {
    "adamw": lambda: tf.keras.optimizers.AdamW(0.05, weight_decay=0.1),
    "ftrl": lambda: tf.keras.optimizers.Ftrl(0.05, l2_regularization_strength=0.1),
    "adagrad": lambda: tf.keras.optimizers.Adagrad(0.05),  # fused updates
}


def _train(variant, optimizer, optimize):
    x, y = _data()
    model = _model(variant)
    before = model.get_layer("eb").get_weights()[0].copy()
    if optimize:
        model = htf.keras.optimize(model)
        assert [len(pt.members) for pt in model.hybridtf_plan.packed_tables] == [2]  # ea and eb share a variable
    if variant == "loss_none_head":
        loss, y = {"ctr": "binary_crossentropy", "aux": None}, {"ctr": y, "aux": y}
    else:
        loss = "binary_crossentropy"
    model.compile(optimizer=OPTIMIZERS[optimizer](), loss=loss)
    history = model.fit(x, y, batch_size=B, shuffle=False, verbose=0)
    weights = {name: model.get_layer(name).get_weights()[0] for name in ("ea", "eb")}
    return np.array(history.history["loss"]), weights, before


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("variant", ["loss_none_head", "stop_gradient"])
def test_a_packed_table_without_gradient_keeps_its_rows_as_in_the_plain_model(variant, optimizer):
    plain_loss, plain, before = _train(variant, optimizer, optimize=False)
    packed_loss, packed, _ = _train(variant, optimizer, optimize=True)
    np.testing.assert_array_equal(plain["eb"], before)  # Keras skips the table without gradient
    np.testing.assert_array_equal(packed["eb"], before)  # it was decayed (AdamW) or zeroed (FTRL)
    np.testing.assert_allclose(packed_loss, plain_loss, rtol=1e-5)
    np.testing.assert_allclose(packed["ea"], plain["ea"], rtol=1e-5, atol=1e-7)
    assert np.abs(plain["ea"] - _model(variant).get_layer("ea").get_weights()[0]).max() > 1e-3  # ea trained


def test_a_table_of_the_same_name_that_got_a_gradient_in_an_earlier_models_step_does_not_count():
    """What reached a gradient is known per traced step: it was kept for the whole process (a FuncGraph's outer
    graph is the global graph under eager execution), so after any model whose 'eb' trained, a packed 'eb'
    without gradient was decayed by AdamW."""
    x, y = _data()
    tf.keras.utils.set_random_seed(0)
    inputs = [tf.keras.Input((1,), dtype="int64", name=n) for n in "ab"]
    embs = [
        tf.keras.layers.Flatten()(tf.keras.layers.Embedding(v, 4, name=f"e{n}")(i))
        for n, v, i in zip("ab", (20, 30), inputs)
    ]
    earlier = htf.keras.optimize(
        tf.keras.Model(inputs, tf.keras.layers.Dense(1, "sigmoid")(tf.keras.layers.Concatenate()(embs)))
    )
    earlier.compile(optimizer=OPTIMIZERS["adamw"](), loss="binary_crossentropy")
    earlier.fit(x, y, batch_size=B, verbose=0)  # both tables get a gradient here
    _, packed, before = _train("stop_gradient", "adamw", optimize=True)
    np.testing.assert_array_equal(packed["eb"], before)
