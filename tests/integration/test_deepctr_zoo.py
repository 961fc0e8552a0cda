"""More DeepCTR 0.9.4 models, as users build them: every table packs and training matches the plain model.

``test_deepctr.py`` covers the five models of issue 14 in depth (100 steps, Adam, save/load). This file
runs one short exactness check over models whose structure differs from those: attention (AutoInt),
SENET + bilinear interaction (FiBiNET), inner products (PNN), bi-interaction pooling (NFM),
field-aware embeddings (ONN: a table per field pair), convolutions (FGCNN), a transformer over a
behaviour sequence (BST), a BiLSTM over sessions (DSIN: Keras' unrolled backward RNN), and multi-task
towers (MMOE, two outputs); also attention over field pairs (AFM), convolutions over fields (CCPM),
field-pair weights (FwFM), field groups (FLEN), input-aware factors (DIFM), field-embedded
factorization (DeepFEFM), bridged cross and deep layers (EDCN) and progressive layered extraction
(PLE, two outputs). DIEN is left out: DeepCTR 0.9.4's GRU does not build on TensorFlow 2.15 (it calls
``array_ops.stack``, which that version has no more). DSIN failed to train once optimized before the
dataflow fusion's op callback returned the ops' outputs as TensorFlow builds them.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hybridtf as htf

pytest.importorskip("deepctr")
from deepctr import models as dm
from deepctr.feature_column import DenseFeat, SparseFeat, VarLenSparseFeat

STEPS = 6
BATCH = 32
SEQ = 5


def _sparse(n):
    return [SparseFeat(f"C{i}", vocabulary_size=40 + 10 * i, embedding_dim=4) for i in range(n)]


def _grouped(n):
    return [SparseFeat(f"C{i}", 40 + 10 * i, embedding_dim=4, group_name=f"group{i % 2}") for i in range(n)]


def _sequence_columns(kind):
    base = [SparseFeat("user", 30, embedding_dim=4), SparseFeat("item_id", 40, embedding_dim=4)]
    base += [SparseFeat("cate_id", 10, embedding_dim=4), DenseFeat("pay", 1)]
    if kind == "BST":
        hist = dict(maxlen=SEQ, length_name="seq_length")
        return [
            *base,
            VarLenSparseFeat(SparseFeat("hist_item_id", 40, embedding_dim=4, embedding_name="item_id"), **hist),
            VarLenSparseFeat(SparseFeat("hist_cate_id", 10, embedding_dim=4, embedding_name="cate_id"), **hist),
        ]
    sessions = []
    for s in range(2):
        for name, vocab in (("item_id", 40), ("cate_id", 10)):
            feat = SparseFeat(f"sess_{s}_{name}", vocab, embedding_dim=4, embedding_name=name)
            sessions.append(VarLenSparseFeat(feat, maxlen=SEQ))
    return base + sessions


MODELS = {
    "AutoInt": lambda: dm.AutoInt([*_sparse(4), DenseFeat("I0", 1)], [*_sparse(4), DenseFeat("I0", 1)], seed=5),
    "FiBiNET": lambda: dm.FiBiNET(_sparse(4), _sparse(4), seed=5),
    "PNN": lambda: dm.PNN(_sparse(4), seed=5),
    "NFM": lambda: dm.NFM(_sparse(4), _sparse(4), seed=5),
    "ONN": lambda: dm.ONN(_sparse(4), _sparse(4), seed=5),
    "FGCNN": lambda: dm.FGCNN(
        _sparse(8),
        _sparse(8),
        conv_kernel_width=(3, 3),
        conv_filters=(4, 4),
        new_maps=(2, 2),
        pooling_width=(2, 2),
        seed=5,
    ),
    "AFM": lambda: dm.AFM(_sparse(4), _sparse(4), seed=5),
    "CCPM": lambda: dm.CCPM(_sparse(6), _sparse(6), conv_kernel_width=(3, 2), conv_filters=(2, 1), seed=5),
    "FwFM": lambda: dm.FwFM(_sparse(4), _sparse(4), seed=5),
    "FLEN": lambda: dm.FLEN(_grouped(4), _grouped(4), seed=5),
    "DIFM": lambda: dm.DIFM(_sparse(4), _sparse(4), seed=5),
    "DeepFEFM": lambda: dm.DeepFEFM(_sparse(4), _sparse(4), seed=5),
    "EDCN": lambda: dm.EDCN(_sparse(4), _sparse(4), seed=5),
    "PLE": lambda: dm.PLE([*_sparse(4), DenseFeat("I0", 1)], seed=5),
    "MMOE": lambda: dm.MMOE([*_sparse(4), DenseFeat("I0", 1)], seed=5),
    "BST": lambda: dm.BST(_sequence_columns("BST"), ["item_id", "cate_id"], seed=5),
    "DSIN": lambda: dm.DSIN(_sequence_columns("DSIN"), ["item_id", "cate_id"], sess_max_count=2, seed=5),
}


def _batches(model, steps):
    rng = np.random.default_rng(0)
    vocab = {"user": 30, "item_id": 40, "cate_id": 10}
    out = []
    for _ in range(steps):
        x = {}
        for t in model.inputs:
            name, shape = t.name.split(":")[0], t.shape.as_list()
            if t.dtype.is_floating:
                x[name] = rng.random((BATCH, *shape[1:])).astype(np.float32)
            elif name == "seq_length":
                x[name] = rng.integers(1, SEQ + 1, (BATCH, 1))
            elif name == "sess_length":
                x[name] = rng.integers(1, 3, (BATCH, 1))
            else:
                shared = [v for k, v in vocab.items() if name.endswith(k)]  # hist_/sess_ share these tables
                high = shared[0] if shared else 40 + 10 * int(name[1:])
                x[name] = rng.integers(1, high, (BATCH, *shape[1:]))
        y = rng.integers(0, 2, (BATCH, 1)).astype(np.float32)
        out.append(({k: tf.constant(v) for k, v in x.items()}, tf.constant(y)))
    return out


@pytest.mark.parametrize("kind", list(MODELS))
def test_deepctr_model_packs_every_table_and_trains_exactly(kind):
    tf.keras.utils.set_random_seed(5)
    plain = MODELS[kind]()
    tf.keras.utils.set_random_seed(5)
    packed = MODELS[kind]()
    batches = _batches(plain, STEPS)
    if len(plain.outputs) > 1:
        batches = [(x, tuple([y] * len(plain.outputs))) for x, y in batches]
    plain(batches[0][0])
    packed(batches[0][0])
    packed.set_weights(plain.get_weights())
    packed = htf.keras.optimize(packed)
    tables = {layer.name for layer in plain._flatten_layers() if isinstance(layer, tf.keras.layers.Embedding)}
    assert packed.hybridtf_skipped == []
    assert {m.name for pt in packed.hybridtf_plan.packed_tables for m in pt.members} == tables
    losses = []
    for model in (plain, packed):
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
        losses.append([np.ravel(model.train_on_batch(x, y))[0] for x, y in batches])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5, atol=0)
