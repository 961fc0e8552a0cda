"""Dataflow fusions: the same Wide & Deep written three ways gets the same fused ops, with the same numbers.

The model (``benchmarks.handwritten_models``) is written with Keras layers (``Flatten`` + ``Concatenate``), with
custom layers calling ``tf.concat`` (DeepCTR's ``[B, 1, d]`` concat + ``Flatten``), and as a subclassed model
calling ``tf.concat`` in ``call``; its wide part (dim-1 embeddings) is summed with a Keras ``Add`` (a chain of
``AddV2``), ``tf.add_n`` or ``tf.reduce_sum`` over a concat / stack (also a stack on a new first axis). Every
variant must train exactly like its plain model (1e-5 relative; all variants compute the same function from the
same weights, so each is compared with the plain Keras-layers model) and run the same fused ops: the deep
input's concatenation and first Dense layer become one StitchConcatMatMul, the wide sum one StitchConcat whose
gradient reads a [B, 1] column.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf
from benchmarks import handwritten_models as hm
from hybridtf._src.rewrite.add_n_rounding import FUSED_SUM_SCOPE
from tests.integration.step_ops import graph_pruned_ops, pruned_op_types, step_graph, step_op_types

VOCABS = [50, 80, 120, 30, 60, 200]
STEPS = 12

# (style, wide sum): every style and every wide sum at least once
VARIANTS = [
    ("keras", "add"),
    ("keras", "reduce_sum"),
    ("custom_layer", "add"),
    ("custom_layer", "add_n"),
    ("subclassed", "add"),
    ("subclassed", "add_n"),
    ("subclassed", "reduce_sum"),
    ("keras", "stack_sum"),  # reduce_sum(tf.stack(fields), 0): was left unfused
    ("subclassed", "stack_sum"),
]


@pytest.fixture(scope="module")
def batches():
    return [hm.batch(VOCABS, 3, 64, seed=s) for s in range(STEPS)]


def _train(model, batches):
    model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    return np.array([model.train_on_batch(x, y) for x, y in batches])


def _counted_types(graph) -> list[str]:
    """Types of the ops the step runs, without the fused field sum's own adds (``add_n_sum``'s column adds)."""
    return [op.type for op in graph_pruned_ops(graph) if FUSED_SUM_SCOPE not in op.name]


def _hybrid_ops(types) -> collections.Counter:
    """hybridtf's ops and the ops a per-field concatenation or sum would multiply."""
    return collections.Counter(t for t in types if t.startswith("HybridTF>") or t in ("AddV2", "AddN", "MatMul"))


@pytest.fixture(scope="module")
def reference(batches):
    """Losses of the plain Keras-layers model (every variant computes the same function) and its fused ops."""
    plain = hm.wide_and_deep("keras", "add", VOCABS)
    fused = htf.keras.optimize(hm.wide_and_deep("keras", "add", VOCABS))
    losses = _train(fused, batches)
    np.testing.assert_allclose(losses, _train(plain, batches), rtol=1e-5, atol=0)
    return losses, _hybrid_ops(_counted_types(step_graph(fused, batches)))


@pytest.mark.parametrize("style,wide", VARIANTS)
def test_same_fused_ops_and_exact_in_every_style(style, wide, batches, reference):
    ref_losses, ref_ops = reference
    fused = htf.keras.optimize(hm.wide_and_deep(style, wide, VOCABS))
    # every style computes the same function from the same weights: exact vs the plain model of the fixture
    np.testing.assert_allclose(_train(fused, batches), ref_losses, rtol=1e-5, atol=0)

    graph = step_graph(fused, batches)
    types = _counted_types(graph)
    ops = _hybrid_ops(types)
    assert ops == ref_ops
    assert ops["HybridTF>StitchConcatMatMul"] == 1 and ops["HybridTF>StitchConcatMatMulGrad"] == 1  # deep input
    assert ops["HybridTF>StitchConcat"] == 1 and ops["HybridTF>StitchConcatGrad"] == 1  # the wide sum
    assert ops["HybridTF>StitchCombine"] == 0 and "ConcatV2" not in types and "Pack" not in types
    (wide_grad,) = [op for op in graph.get_operations() if op.type == "HybridTF>StitchConcatGrad"]
    assert wide_grad.get_attr("broadcast_grad")  # reads the [B, 1] column, never a [B, W] tile
    assert fused.hybridtf_fused_dense == ["h0"]
    assert len(fused.hybridtf_fused_concats) >= 2  # the deep concatenation(s) and the wide sum


def test_fusion_off_keeps_the_users_ops(batches, reference):
    fused = htf.keras.optimize(hm.wide_and_deep("subclassed", "add", VOCABS), fuse_concat=False)
    losses = _train(fused, batches)
    types = pruned_op_types(fused, batches)
    assert "HybridTF>StitchConcat" not in types and "HybridTF>StitchConcatMatMul" not in types
    assert "ConcatV2" in types
    assert types.count("AddV2") >= reference[1]["AddV2"] + len(VOCABS) - 1  # the wide part's chain of adds
    assert fused.hybridtf_fused_concats == [] and fused.hybridtf_fused_dense == []
    plain = hm.wide_and_deep("subclassed", "add", VOCABS)
    np.testing.assert_allclose(losses, _train(plain, batches), rtol=1e-5, atol=0)


def test_field_feeding_a_fusion_and_another_op_gets_both_gradients(batches):
    """A field that is concatenated and also used elsewhere keeps its StitchCombine output for the other use."""

    class Model(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.embs = [tf.keras.layers.Embedding(v, 4, name=f"e{i}") for i, v in enumerate(VOCABS[:3])]
            self.out = tf.keras.layers.Dense(1, kernel_initializer="ones", name="out")

        def call(self, x):
            e = [tf.squeeze(layer(x[f"f{i}"]), 1) for i, layer in enumerate(self.embs)]
            side = tf.reduce_sum(e[0] * e[1], axis=1, keepdims=True)  # FM-like: not fusable
            return tf.sigmoid(self.out(tf.concat(e, axis=1)) + side)

    tf.keras.utils.set_random_seed(3)
    plain = Model()
    plain(batches[0][0])
    tf.keras.utils.set_random_seed(3)
    fused = Model()
    fused(batches[0][0])
    fused = htf.keras.optimize(fused)
    np.testing.assert_allclose(_train(fused, batches), _train(plain, batches), rtol=1e-5, atol=0)
    ops = _hybrid_ops(_counted_types(step_graph(fused, batches)))
    assert ops["HybridTF>StitchConcatMatMul"] == 1 and ops["HybridTF>StitchCombine"] == 1


@pytest.mark.parametrize("take", ["index", "squeeze"])
def test_indexing_away_the_ids_axis_is_seen_through_like_squeeze(take, batches):
    """``emb(ids)[:, 0, :]`` of a ``[B, 1, d]`` lookup keeps every value in order: fused as ``tf.squeeze`` is."""

    class Model(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.embs = [tf.keras.layers.Embedding(v, 4, name=f"e{i}") for i, v in enumerate(VOCABS[:4])]
            self.hidden = tf.keras.layers.Dense(8, activation="relu", name="hidden")
            self.out = tf.keras.layers.Dense(1, activation="sigmoid", name="out")

        def call(self, x):
            looked_up = [layer(x[f"f{i}"]) for i, layer in enumerate(self.embs)]
            e = [t[:, 0, :] if take == "index" else tf.squeeze(t, 1) for t in looked_up]
            return self.out(self.hidden(tf.concat(e, axis=1)))

    models = []
    for _ in range(2):
        tf.keras.utils.set_random_seed(3)
        models.append(Model())
        models[-1](batches[0][0])
    plain, fused = models[0], htf.keras.optimize(models[1])
    np.testing.assert_allclose(_train(fused, batches), _train(plain, batches), rtol=1e-5, atol=0)
    ops = _hybrid_ops(_counted_types(step_graph(fused, batches)))
    assert ops["HybridTF>StitchConcatMatMul"] == 1 and ops["HybridTF>StitchCombine"] == 0
    assert fused.hybridtf_fused_dense == ["hidden"]


def test_eager_and_exported_calls_run_the_users_ops(batches, tmp_path):
    model = htf.keras.optimize(hm.wide_and_deep("custom_layer", "add_n", VOCABS))
    plain = hm.wide_and_deep("custom_layer", "add_n", VOCABS)
    x = batches[0][0]
    np.testing.assert_allclose(model(x).numpy(), plain(x).numpy(), rtol=1e-6, atol=1e-7)  # eager: no callback
    assert model.hybridtf_fused_concats == []
    tf.saved_model.save(model, str(tmp_path / "sm"))
    fn = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    ops = {node.op for f in fn.graph.as_graph_def().library.function for node in f.node_def}
    assert not any(op.startswith("HybridTF>Stitch") for op in ops)


@pytest.mark.parametrize("name", ["WDL", "DeepFM", "DCN"])
def test_deepctr_models_get_the_same_fusions(name):
    """DeepCTR's own Concat / Add / Linear / DNN (tensordot) layers: the linear part, FM and the DNN input fuse;
    DeepFM's FM cross term becomes one StitchFM; DCN's cross layers' per-example outer products
    (``BatchMatMulV2`` of ``[B, W, 1]`` by ``[B, 1, 1]``) become broadcast multiplies.

    Its embeddings carry ``embeddings_regularizer`` (not packed on this branch), so they are removed here, in both
    models alike.
    """
    deepctr_models = pytest.importorskip("deepctr.models")
    from deepctr.feature_column import DenseFeat, SparseFeat

    feats = [SparseFeat(f"C{i}", vocabulary_size=v, embedding_dim=4) for i, v in enumerate(VOCABS)]
    feats.append(DenseFeat("I0", 1))
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(STEPS):
        x = {f"C{i}": tf.constant(rng.integers(0, v, 64)) for i, v in enumerate(VOCABS)}
        x["I0"] = tf.constant(rng.standard_normal(64).astype(np.float32))
        batches.append((x, tf.constant(rng.integers(0, 2, (64, 1)).astype(np.float32))))

    def build():
        tf.keras.utils.set_random_seed(1)
        model = getattr(deepctr_models, name)(feats, feats, seed=1)
        for layer in model._flatten_layers(include_self=False, recursive=True):
            if isinstance(layer, tf.keras.layers.Embedding):
                layer.embeddings_regularizer = None
                layer._callable_losses.clear()
        return model

    plain, fused = build(), htf.keras.optimize(build(), fuse_dense="always")  # DNN(256): wider than auto fuses
    assert fused.hybridtf_skipped == []
    np.testing.assert_allclose(_train(fused, batches), _train(plain, batches), rtol=1e-5, atol=0)
    graph = step_graph(fused, batches)
    types = _counted_types(graph)
    ops = _hybrid_ops(types)
    assert ops["HybridTF>StitchConcatMatMul"] == 1 and ops["HybridTF>StitchCombine"] == 0
    # the linear logits, plus the cross network's input (DCN); DeepFM's FM reads its fields in one StitchFM
    assert ops["HybridTF>StitchConcat"] == (2 if name == "DCN" else 1)
    assert ops["HybridTF>StitchFM"] == (1 if name == "DeepFM" else 0)
    assert (fused.hybridtf_fused_fm != []) == (name == "DeepFM")
    grads = [op.get_attr("broadcast_grad") for op in graph.get_operations() if op.type == "HybridTF>StitchConcatGrad"]
    assert sorted(grads) == ([False, True] if name == "DCN" else [True])  # the linear part reads a [B, 1] column
    assert "BatchMatMulV2" not in types


def test_per_example_outer_product_becomes_a_broadcast_multiply(batches):
    """A cross layer (DCN's ``x0 @ (x_l . w)``, a ``[B, W, 1] @ [B, 1, 1]`` batched matmul) is a ``Mul``: exact."""

    class Cross(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.embs = [tf.keras.layers.Embedding(v, 4, name=f"e{i}") for i, v in enumerate(VOCABS[:3])]
            self.w = tf.keras.layers.Dense(1, use_bias=False, name="w")
            self.out = tf.keras.layers.Dense(1, name="out")

        def call(self, x):
            x0 = tf.concat([tf.squeeze(layer(x[f"f{i}"]), 1) for i, layer in enumerate(self.embs)], axis=1)
            x1 = tf.squeeze(tf.matmul(tf.expand_dims(x0, 2), tf.expand_dims(self.w(x0), 2)), 2) + x0
            return tf.sigmoid(self.out(x1))

    models = []
    for _ in range(2):
        tf.keras.utils.set_random_seed(5)
        model = Cross()
        model(batches[0][0])
        models.append(model)
    plain, fused = models[0], htf.keras.optimize(models[1])
    np.testing.assert_allclose(_train(fused, batches), _train(plain, batches), rtol=1e-5, atol=0)
    assert "BatchMatMulV2" in pruned_op_types(plain, batches)
    assert "BatchMatMulV2" not in pruned_op_types(fused, batches)


def test_custom_loop_with_hybridtf_function_gets_the_same_fusions(batches, reference):
    """Inside ``htf.function`` the model's forward pass is rewritten too (never the user's backward or update)."""

    def loop(model, function):
        opt = tf.keras.optimizers.Adagrad(0.05)

        @function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(y, model(x)))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return np.array([step(x, y).numpy() for x, y in batches]), step

    plain_losses, _ = loop(hm.wide_and_deep("subclassed", "add", VOCABS), tf.function)
    model = htf.keras.optimize(hm.wide_and_deep("subclassed", "add", VOCABS))
    losses, step = loop(model, htf.function)
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5, atol=0)
    graph = step.get_concrete_function(*batches[0]).graph
    ops = _hybrid_ops(_counted_types(graph))
    for op_type in ("HybridTF>StitchConcatMatMul", "HybridTF>StitchConcatMatMulGrad", "HybridTF>StitchConcatGrad"):
        assert ops[op_type] == reference[1][op_type] == 1
    assert model.hybridtf_fused_dense == ["h0"]


@pytest.mark.parametrize("n", [2, 3, 8, 9, 10, 17, 26, 201])
@pytest.mark.parametrize("width", [None, 4])
def test_fused_field_sum_rounds_like_add_n_bit_for_bit(n, width):
    """The fused sum adds its columns as TensorFlow's CPU AddN kernel adds its inputs (what a plain graph's chain of
    adds runs after Grappler): the same floats, not merely close. Magnitudes spread over 1e-7..1e7 make any other
    association round differently."""
    from hybridtf._src.rewrite.add_n_rounding import add_n_order, add_n_sum

    rng = np.random.default_rng(n)
    shape = (64, n) if width is None else (64, n, width)
    x = tf.constant((rng.standard_normal(shape) * np.exp(rng.uniform(-16, 16, shape))).astype(np.float32))
    terms = [x[:, i : i + 1] if width is None else x[:, i] for i in range(n)]
    np.testing.assert_array_equal(add_n_sum(x).numpy(), tf.add_n(terms).numpy())
    if n > 8 and width is None:  # Eigen reduces an inner axis in SIMD lanes: another rounding
        assert not np.array_equal(tf.reduce_sum(x, axis=1).numpy().ravel(), tf.add_n(terms).numpy().ravel())
    # Grappler sorts a commutative op's inputs by name: "f10" before "f2"
    assert add_n_order([f"f{i}" for i in range(12)])[:4] == [0, 1, 10, 11]


@pytest.mark.parametrize("wide", ["add", "add_n"])
def test_field_sum_is_built_once_not_per_partial_sum(wide, batches):
    """A chain of adds over n fields builds one fused sum where the sum is used, not n - 1 partial fused sums
    left dead in the traced step (they were most of a 200-field model's traced ops)."""
    fused = htf.keras.optimize(hm.wide_and_deep("subclassed", wide, VOCABS))
    fused.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    traced = collections.Counter(step_op_types(fused, batches))
    # the wide sum, plus the deep concatenation that StitchConcatMatMul replaced (one unused op)
    assert traced["HybridTF>StitchConcat"] == 2
    assert traced["Cumsum"] == 0  # add_n_sum adds whole column slices (a cumsum scans row by row: 9x slower)
    assert traced["Split"] <= 3  # one add_n_sum: the head block, the blocks of eight, the running total


def _linear_models(batches, head=lambda s: s):
    """A plain and an optimized linear model (``head`` of the sum of dim-1 embeddings) from the same weights."""

    class Linear(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.embs = [tf.keras.layers.Embedding(v, 1, name=f"w{i}") for i, v in enumerate(VOCABS)]
            self.activation = tf.keras.layers.Activation("sigmoid")

        def call(self, x):
            return head(self, tf.add_n([tf.reshape(layer(x[f"f{i}"]), [-1, 1]) for i, layer in enumerate(self.embs)]))

    models = []
    for _ in range(2):
        tf.keras.utils.set_random_seed(7)
        model = Linear()
        model(batches[0][0])
        models.append(model)
    return models[0], htf.keras.optimize(models[1])


def _assert_sum_fused_and_exact(plain, fused, batches, loss):
    def train(model):
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss=loss)
        return np.array([model.train_on_batch(x, y) for x, y in batches])

    np.testing.assert_allclose(train(fused), train(plain), rtol=1e-5, atol=0)
    ops = _hybrid_ops(_counted_types(step_graph(fused, batches)))
    assert ops["HybridTF>StitchConcat"] == 1 and ops["HybridTF>StitchConcatGrad"] == 1, ops
    assert ops["HybridTF>StitchCombine"] == 0, ops
    assert len(fused.hybridtf_fused_concats) == 1


def test_field_sum_returned_by_the_model_is_fused_for_the_loss(batches):
    """A model whose output is the sum itself (a linear model): the loss, outside the forward pass, uses the fused
    sum."""
    plain, fused = _linear_models(batches, lambda model, s: s)
    _assert_sum_fused_and_exact(plain, fused, batches, tf.keras.losses.BinaryCrossentropy(True))


@pytest.mark.parametrize(
    "head",
    [
        lambda model, s: tf.keras.activations.sigmoid(s),
        lambda model, s: model.activation(s),
        lambda model, s: tf.sigmoid(s),
    ],
    ids=["keras_sigmoid", "activation_layer", "tf_sigmoid"],
)
def test_field_sum_under_the_output_sigmoid_is_fused_for_the_loss(batches, head):
    """Keras's cross-entropy reads a returned sigmoid's input (``_keras_logits``), not the sigmoid: that input is the
    fused sum too, or the step trains through the user's adds and the fused sum is pruned (while the report said
    fused)."""
    plain, fused = _linear_models(batches, head)
    _assert_sum_fused_and_exact(plain, fused, batches, "binary_crossentropy")


def test_lookups_come_out_of_the_chain_in_their_ids_shape(batches):
    """Keras's ``[B, 1]`` ids give ``[B, 1, d]`` lookups: StitchCombine writes that shape itself
    (``id_shapes``), so the traced step has no per-lookup ``Reshape`` of a StitchCombine output
    (they were 400 of a 200-field W&D's 1,182 traced ops)."""
    fused = htf.keras.optimize(hm.wide_and_deep("subclassed", "add", VOCABS))
    fused.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    graph = step_graph(fused, batches)
    combines = [op for op in graph.get_operations() if op.type == "HybridTF>StitchCombine"]
    assert combines
    for op in combines:
        assert [o.shape.as_list()[1:] for o in op.outputs] == [[1, op.outputs[0].shape[-1]]] * len(op.outputs)
        chain = op.name.rsplit("/", 2)[0] + "/"  # the packed table's chain scope (the model's own reshapes stay)
        assert chain.split("/")[-2].startswith("packed_")
        reshapes = [c.name for o in op.outputs for c in o.consumers() if c.type == "Reshape"]
        assert not [name for name in reshapes if name.startswith(chain)]


def _unshaped_dataset(batches):
    """The batches as a ``Dataset.from_generator`` without shapes (every dim None), as a Python generator or a
    ``keras.utils.Sequence`` reaches ``fit``."""
    x0, y0 = batches[0]
    signature = (
        {k: tf.TensorSpec([None] * v.shape.rank, v.dtype) for k, v in x0.items()},
        tf.TensorSpec([None] * y0.shape.rank, y0.dtype),
    )
    return tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=signature)


def test_batches_without_static_shapes_get_the_fusions_from_the_declared_inputs(batches, reference):
    fused = htf.keras.optimize(hm.wide_and_deep("keras", "add", VOCABS))
    fused.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    history = fused.fit(_unshaped_dataset(batches).repeat(), steps_per_epoch=1, epochs=STEPS, verbose=0)
    np.testing.assert_allclose(history.history["loss"], reference[0], rtol=1e-5, atol=0)
    assert fused.hybridtf_fused_dense == ["h0"] and len(fused.hybridtf_fused_concats) >= 2
    for concrete in fused.train_function._list_all_concrete_functions():  # the first trace's, and the step's
        types = [op.type for op in graph_pruned_ops(concrete.graph)]
        assert "HybridTF>StitchConcatMatMul" in types and "ConcatV2" not in types


def test_a_batch_contradicting_the_declared_input_shape_names_the_input(batches):
    fused = htf.keras.optimize(hm.wide_and_deep("keras", "add", VOCABS))
    fused.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
    x, y = batches[0]
    wide = {**x, "f2": tf.concat([x["f2"], x["f2"]], axis=1)}  # [B, 2] ids where the model declares shape (1,)
    with pytest.raises(tf.errors.InvalidArgumentError, match="hybridtf_declared_shape_f2"):
        fused.fit(_unshaped_dataset([(wide, y)]), verbose=0)


def test_declared_shapes_leave_the_batch_dimension_free():
    """``Input(batch_size=32)``: Keras's input check ignores the batch size, and so does hybridtf's shape hint (a
    last partial batch trains as in the plain model)."""

    def build():
        tf.keras.utils.set_random_seed(0)
        ids = tf.keras.Input(shape=(1,), batch_size=32, dtype="int64", name="ids")
        emb = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(100, 4)(ids))
        return tf.keras.Model({"ids": ids}, tf.keras.layers.Dense(1, activation="sigmoid")(emb))

    rng = np.random.default_rng(0)
    data = [({"ids": rng.integers(0, 100, (n, 1))}, rng.integers(0, 2, (n, 1)).astype("float32")) for n in (32, 17)]
    losses = []
    for model in (build(), htf.keras.optimize(build())):
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
        dataset = _unshaped_dataset([({"ids": tf.constant(x["ids"])}, tf.constant(y)) for x, y in data])
        losses.append(model.fit(dataset, verbose=0).history["loss"])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5, atol=0)
