"""Exact gradient clipping (``clipnorm``, ``global_clipnorm``, ``clipvalue``) for packed tables.

Keras measures an embedding table's gradient as one row per lookup position
(a repeated id's rows separately): ``tf.clip_by_norm`` and
``tf.clip_by_global_norm`` read the IndexedSlices' values. A packed table's
gradient has one summed row per distinct id and spans several tables, so its
norm is another number. To clip exactly, each table's norm is measured where
its per-position rows exist, the upstream gradient of its lookups:

* ``GradientNorms.track`` wraps every lookup output of a packed table in an
  identity whose gradient adds ``sum(dy ** 2)`` to the table's entry of a
  small variable (one float per member table; the backward pass of one step
  adds every lookup of the table, micro-batches included);
* ``clip`` (called by the hooked optimizer before Keras's own update, with
  Keras's clipping off for that call) reads and resets the sums, and scales
  each packed table's rows by its member's factor (``clipnorm``) or everything
  by the global factor (``global_clipnorm``), with Keras's formulas.

A table whose plain gradient has one row per distinct id already (a
``hybridtf.layers.EmbeddingBag``: its own chain sums them) or is dense (a
Keras L1/L2 regularizer adds a gradient to every row, so the tape sums the
lookups' rows into it) is measured on the packed gradient's rows instead,
which are then exactly those values; so is a gradient the step turned dense
(``tf.convert_to_tensor``, an accumulation buffer: Keras measures the summed
rows then too). The dataflow fusions are off while the
sums are tracked (a fused concatenation would read the chain's rows directly
and bypass the identities).

``clipvalue`` (when neither norm is set, as in Keras) clips where Keras does:
Keras clips each per-position row of an embedding gradient before the
optimizer sums a repeated id's rows, so the identity's gradient is
``clip_by_value(dy)`` itself (the chain then sums the clipped rows); a
table measured on its packed rows (a bag, a regularized table) has its
packed rows clipped instead, and every other variable's gradient is clipped
by ``tf.clip_by_value`` as Keras would.
"""

from __future__ import annotations

import logging

import numpy as np
import tensorflow as tf

from hybridtf._src.gradient_registry import graph_owned_gradients

_log = logging.getLogger("hybridtf")


class GradientNorms:
    """Per member table of a ``PackedTables``: the sum of squares of its lookups' per-position gradient rows.

    Args:
        storage: the packed tables (one process, unsharded).
        clipvalue: set (and no norm clipping): the lookups' per-position
            gradient rows are clipped to ``[-clipvalue, clipvalue]`` instead
            of measured.

    Example:
        >>> norms = GradientNorms(storage)
        >>> out = norms.track(request, out)  # in the runtime, for each lookup output
    """

    def __init__(self, storage, clipvalue: float | None = None):
        self.storage = storage
        self.clipvalue = clipvalue
        names = [m.name for pt in storage.plan.packed_tables for m in pt.members]
        self.index = {name: i for i, name in enumerate(names)}
        with tf.init_scope():
            self.sums = tf.Variable(tf.zeros([len(names)], tf.float32), trainable=False, name="hybridtf_grad_norms")
        self.row_normed: set[str] = set(storage.regularizers)  # measured on the packed gradient's rows
        self._warned: set[str] = set()

    def track(self, request, out):
        """``out`` (a lookup's output) with its gradient's sum of squares counted for ``request.table``."""
        if request.combiner != "none":  # a bag: its plain gradient has one summed row per id
            self.row_normed.add(request.table)
            return out
        if self.clipvalue is not None and request.table in self.row_normed:  # clipped on its packed rows
            return out
        if isinstance(out, tf.RaggedTensor):
            return out.with_flat_values(self._tracked(out.flat_values, self.index[request.table]))
        return self._tracked(out, self.index[request.table])

    def _tracked(self, x, i: int):
        sums, clipvalue = self.sums, self.clipvalue

        @tf.custom_gradient
        def identity(t):
            def grad(dy):
                dy = tf.convert_to_tensor(dy)
                if clipvalue is not None:  # Keras clips each per-position row of the plain gradient
                    return tf.clip_by_value(dy, -clipvalue, clipvalue)
                add = sums.scatter_nd_add([[i]], [tf.reduce_sum(tf.square(tf.cast(dy, tf.float32)))])
                with tf.control_dependencies([add]):
                    return tf.identity(dy)

            return tf.identity(t), grad

        with graph_owned_gradients():
            return identity(x)

    def take(self) -> tf.Tensor:
        """The sums of this step (the reset for the next step runs after this read)."""
        value = tf.identity(self.sums.read_value())
        with tf.control_dependencies([value]):
            reset = self.sums.assign(tf.zeros_like(self.sums))
        with tf.control_dependencies([reset]):
            return tf.identity(value)

    def row_members(self, name: str, grad):
        """``(rows, values, member of each row)`` of packed table ``name``'s gradient ``grad``."""
        pt = self.storage.plan.packed_table(name)
        offsets = np.array([m.row_offset for m in pt.members], np.int64)
        if isinstance(grad, tf.IndexedSlices):
            rows, values = tf.cast(grad.indices, tf.int64), grad.values
        else:
            rows, values = tf.range(tf.shape(grad, out_type=tf.int64)[0]), grad
        return rows, values, tf.searchsorted(tf.constant(offsets), rows, side="right") - 1

    def clip_values(self, name: str, grad):
        """Packed table ``name``'s gradient with the rows of its tables measured on packed rows clipped.

        The other tables' rows are sums of per-position rows the lookups' identities clipped already.
        """
        pt = self.storage.plan.packed_table(name)
        own = [m.name in self.row_normed for m in pt.members]
        if not isinstance(grad, tf.IndexedSlices) and not all(own) and name not in self._warned:
            self._warned.add(name)
            _log.warning(
                "hybridtf: packed table %r's gradient reached the optimizer as a dense tensor (the step converted "
                "it, e.g. to accumulate it): clipvalue clipped each lookup's gradient rows before a repeated id's "
                "rows were summed, and Keras clips the dense tensor's summed rows, so this update is NOT the "
                "plain model's. Pass the tape's IndexedSlices to apply_gradients, or keep the tables unpacked "
                "(optimize(model, exclude=[...])).",
                name,
            )
        if not any(own):
            return grad
        _, values, member = self.row_members(name, grad)
        clipped = tf.clip_by_value(values, -self.clipvalue, self.clipvalue)
        if all(own):
            return _map_values(grad, lambda _: clipped)
        mask = tf.gather(tf.constant(own), member)[:, None]
        return _map_values(grad, lambda v: tf.where(mask, clipped, v))

    def member_squares(self, name: str, grad, sums) -> tuple:
        """``(squares per member, member of each gradient row)`` of packed table ``name``'s gradient ``grad``."""
        pt = self.storage.plan.packed_table(name)
        tracked = tf.gather(sums, [self.index[m.name] for m in pt.members])
        _, values, member = self.row_members(name, grad)
        # A dense gradient (the step converted the IndexedSlices, e.g. to accumulate them) is what Keras
        # measures in the plain model too: the summed rows, which the packed gradient's rows are.
        dense = not isinstance(grad, tf.IndexedSlices)
        if not dense and not any(m.name in self.row_normed for m in pt.members):
            return tracked, member
        row_squares = tf.math.unsorted_segment_sum(
            tf.reduce_sum(tf.square(values), axis=1), member, num_segments=len(pt.members)
        )
        by_rows = tf.constant([dense or m.name in self.row_normed for m in pt.members])
        return tf.where(by_rows, row_squares, tracked), member


def _map_values(grad, fn):
    """``grad`` (a tensor or IndexedSlices) with ``fn`` applied to its values."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(fn(grad.values), grad.indices, grad.dense_shape)
    return fn(grad)


def clip(norms: GradientNorms, grads_and_vars: list, clipnorm, global_clipnorm, clipvalue=None) -> list:
    """``grads_and_vars`` clipped as Keras clips the plain model's gradients (see the module docstring).

    ``clipnorm`` (Keras applies it when set, else ``global_clipnorm``, else
    ``clipvalue``): each packed table's rows of member ``m`` become
    ``g * clipnorm / max(norm_m, clipnorm)``, every other gradient
    ``tf.clip_by_norm``. ``global_clipnorm``: the global norm counts each
    member's squares in place of its packed rows. ``clipvalue``: the packed
    tables' per-position rows were clipped in the backward pass already (only
    their bags' and regularized tables' packed rows are clipped here), every
    other gradient by ``tf.clip_by_value``.
    """
    packed = {id(v): name for name, v in norms.storage.packed.items()}
    if not (clipnorm or global_clipnorm):
        return [
            (
                g
                if g is None
                else norms.clip_values(packed[id(v)], g)
                if id(v) in packed
                else tf.clip_by_value(g, -clipvalue, clipvalue),
                v,
            )
            for g, v in grads_and_vars
        ]
    sums = norms.take()
    if clipnorm:
        out = []
        for g, v in grads_and_vars:
            if g is None or id(v) not in packed:
                out.append((g if g is None else tf.clip_by_norm(g, clipnorm), v))
                continue
            squares, member = norms.member_squares(packed[id(v)], g, sums)
            # tf.clip_by_norm's safe square root: a zero gradient keeps its norm 0
            positive = squares > 0
            norm = tf.where(positive, tf.sqrt(tf.where(positive, squares, tf.ones_like(squares))), squares)
            denominator = tf.gather(tf.maximum(norm, clipnorm), member)[:, None]
            out.append((_map_values(g, lambda values, d=denominator: values * clipnorm / d), v))
        return out
    halves = []  # tf.linalg.global_norm: sqrt(2 * sum of l2_loss)
    for g, v in grads_and_vars:
        if g is None:
            continue
        if id(v) in packed:
            squares, _ = norms.member_squares(packed[id(v)], g, sums)
            halves.append(tf.reduce_sum(squares) / 2)
        else:
            halves.append(tf.nn.l2_loss(g.values if isinstance(g, tf.IndexedSlices) else g))
    use_norm = tf.sqrt(tf.reduce_sum(tf.stack(halves)) * 2)
    scale = global_clipnorm * tf.minimum(1.0 / use_norm, 1.0 / global_clipnorm)
    scale = tf.where(tf.math.is_finite(use_norm), scale, float("nan"))
    return [(g if g is None else _map_values(g, lambda x: x * tf.cast(scale, x.dtype)), v) for g, v in grads_and_vars]
