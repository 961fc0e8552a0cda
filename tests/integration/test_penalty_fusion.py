"""The penalties of regularized packed tables: one RegularizationPenalty op per packed table, Keras's values.

Once a fused optimizer folds the regularizers' gradient into the packed update
(``compile``), every regularized member's penalty in ``model.losses`` comes
from one ``HybridTF>RegularizationPenalty`` op of its packed table (one read
pass) instead of a gather of all the member's rows and the regularizer's ops.
The values equal the plain model's within 1e-6 relative, before and after
training, in a graph and eagerly, and an op that writes the variable between
two evaluations of ``model.losses`` in one graph gets a fresh read.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from hybridtf._src.run.regularized_apply import PENALTY_OP
from tests.integration.test_regularizers import _batches, _pair, _regularizers, _train

R = tf.keras.regularizers


def _graph_losses(model):
    fn = tf.function(lambda: model.losses)
    return fn, [op.type for op in fn.get_concrete_function().graph.get_operations()]


def _values(losses):
    return np.array([float(v) for v in losses])


def test_losses_come_from_one_op_per_packed_table_with_keras_values():
    regs = _regularizers()
    plain, packed = _pair(regs)
    packed.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")  # folds the gradient
    fn, types = _graph_losses(packed)
    assert types.count(PENALTY_OP) == len(packed.hybridtf_plan.packed_tables) == 1
    assert not {"ResourceGather", "L2Loss", "Abs", "Square"} & set(types)  # no per-member reads or math
    want = _values(plain.losses)
    np.testing.assert_allclose(_values(fn()), want, rtol=1e-6, atol=0)
    np.testing.assert_allclose(_values(packed.losses), want, rtol=1e-6, atol=0)  # eager: one op per member
    batches = _batches(regs, 15)
    expected = _train(plain, tf.keras.optimizers.Adagrad(0.05), batches)
    got = np.array([packed.train_on_batch(x, y) for x, y in batches])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=0)
    np.testing.assert_allclose(_values(fn()), _values(plain.losses), rtol=1e-6, atol=0)


def test_a_write_between_two_evaluations_in_one_graph_is_seen():
    regs = {"a": R.l2(0.02), "b": None, "d": R.l1_l2(0.01, 0.02)}
    plain, packed = _pair(regs)
    packed.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="binary_crossentropy")
    variable = packed.get_layer("emb_a").embeddings.packed_variable

    @tf.function
    def before_and_after():
        before = packed.losses
        variable.assign(variable * 2.0)
        return before, packed.losses

    before, after = before_and_after()
    graph = before_and_after.get_concrete_function().graph
    assert [op.type for op in graph.get_operations()].count(PENALTY_OP) == 2
    np.testing.assert_allclose(_values(before), _values(plain.losses), rtol=1e-6)
    plain.set_weights([w * 2.0 if w.ndim == 2 and w.shape[1] == 4 else w for w in plain.get_weights()])
    np.testing.assert_allclose(_values(after), _values(plain.losses), rtol=1e-6)
    np.testing.assert_allclose(_values(packed.losses), _values(plain.losses), rtol=1e-6)


def test_weights_set_outside_training_are_seen():
    regs = {"a": R.l2(0.02), "d": R.l1(0.01)}
    plain, packed = _pair(regs)
    _train(packed, tf.keras.optimizers.Adagrad(0.05), _batches(regs, 3))
    packed.set_weights(plain.get_weights())  # back to the initial weights, outside any step
    fn, _ = _graph_losses(packed)
    np.testing.assert_allclose(_values(fn()), _values(plain.losses), rtol=1e-6)
    np.testing.assert_allclose(_values(packed.losses), _values(plain.losses), rtol=1e-6)
