"""``EarlyStopping(restore_best_weights=True)`` brings an optimized model's dynamic tables back to the best epoch.

Keras keeps ``model.get_weights()``, which holds no dynamic table's rows (only the step's buffer), so
the restore left every dynamic table at its last epoch's rows: ``evaluate`` after ``fit`` gave the
last epoch's validation loss, not the best one (found by a probe). A model that overfits noise
labels stops early; afterwards it must evaluate to the best epoch's validation loss, for a packed
store of several tables, for a lone, unpacked table, and next to packed static tables.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf

FIELDS = {"packed_store": 3, "lone_table": 1, "with_static_tables": 2}


def _data(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 60, size=(512, 3)).astype(np.int64) * 7919 + 10**12  # raw, unbounded-looking ids
    return ids, (rng.random((512, 1)) < 0.5).astype(np.float32)


@pytest.mark.parametrize("layout", list(FIELDS))
def test_restore_best_weights_restores_dynamic_tables(layout):
    tf.keras.utils.set_random_seed(0)
    fields = FIELDS[layout]
    ids = tf.keras.Input((3,), dtype=tf.int64)
    embedded = [
        tf.keras.layers.Flatten()(htf.layers.DynamicEmbedding(8, name=f"f{i}", seed=i)(ids[:, i : i + 1]))
        for i in range(fields)
    ]
    if layout == "with_static_tables":  # packed static tables too: the other optimized model class
        embedded += [tf.keras.layers.Flatten()(tf.keras.layers.Embedding(60, 8)(ids[:, 2:3] % 60)) for _ in range(2)]
    x = tf.keras.layers.Concatenate()(embedded) if len(embedded) > 1 else embedded[0]
    model = htf.keras.optimize(tf.keras.Model(ids, tf.keras.layers.Dense(1, activation="sigmoid")(x)))
    model.compile(tf.keras.optimizers.Adam(0.05), "binary_crossentropy")
    train, val = _data(0), _data(1)  # labels are noise: validation loss rises after the first epochs
    stop = tf.keras.callbacks.EarlyStopping("val_loss", patience=2, restore_best_weights=True)
    fit = dict(batch_size=64, epochs=30, verbose=0, shuffle=False, validation_data=val, callbacks=[stop])
    history = model.fit(*train, **fit)
    losses = history.history["val_loss"]
    assert stop.stopped_epoch > 0 and len(losses) < 30  # it stopped early
    assert losses[-1] > min(losses) + 1e-3  # the last epoch is not the best one
    np.testing.assert_allclose(model.evaluate(*val, batch_size=64, verbose=0), min(losses), rtol=1e-5)
