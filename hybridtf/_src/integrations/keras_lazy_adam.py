"""``hybridtf.keras.LazyAdam``: Adam whose sparse updates touch only the batch's rows, and its file mark.

On a packed table it runs as one fused op (``keras_optimizers``); here are the
optimizer itself (its Keras update for unpacked variables) and the mark in a
Keras weights file that keeps LazyAdam's state and Adam's from loading into
each other.
"""

from __future__ import annotations

import tensorflow as tf

from hybridtf._src.integrations import keras_slots
from hybridtf._src.run import sparse_apply


@tf.keras.utils.register_keras_serializable(package="hybridtf")
class LazyAdam(tf.keras.optimizers.Adam):
    """Adam whose sparse updates touch only the rows in the batch (opt-in).

    A different optimizer from Keras Adam: for an IndexedSlices gradient
    (embedding tables), the moments of rows absent from the batch neither
    decay nor move their rows. Dense gradients are updated exactly like Adam.
    On a packed table it runs as one fused op, and its cost per step is
    proportional to the rows touched instead of the table size.

    Args:
        **kwargs: the arguments of ``tf.keras.optimizers.Adam``.

    Example:
        >>> model.compile(optimizer=hybridtf.keras.LazyAdam(0.001), loss="binary_crossentropy")
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.amsgrad:
            raise ValueError(
                "hybridtf.keras.LazyAdam does not support amsgrad=True (its lazy row updates keep no maximum of "
                "the second moments): use tf.keras.optimizers.Adam(amsgrad=True), or LazyAdam without amsgrad."
            )

    def save_own_variables(self, store):
        super().save_own_variables(store)
        _mark_lazy(store, self)

    def load_own_variables(self, store):
        _check_lazy(store, self)
        super().load_own_variables(store)

    def update_step(self, gradient, variable):
        if not isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable)
        dtype = variable.dtype
        alpha = sparse_apply.adam_alpha(self, dtype)
        key = self._var_key(variable)
        m = self._momentums[self._index_dict[key]]
        v = self._velocities[self._index_dict[key]]
        c1 = tf.constant(1 - self.beta_1, dtype)
        c2 = tf.constant(1 - self.beta_2, dtype)
        idx, g = gradient.indices, gradient.values
        m_rows = tf.gather(m, idx)
        v_rows = tf.gather(v, idx)
        m_new = (m_rows + (-m_rows) * c1) + g * c1
        v_new = (v_rows + (-v_rows) * c2) + tf.square(g) * c2
        m.scatter_update(tf.IndexedSlices(m_new, idx))
        v.scatter_update(tf.IndexedSlices(v_new, idx))
        rows = tf.gather(variable, idx)
        eps = tf.constant(self.epsilon, dtype)
        variable.scatter_update(tf.IndexedSlices(rows - (m_new * alpha) / (tf.sqrt(v_new) + eps), idx))


_LAZY_MARK = "hybridtf_lazy_adam"


def _mark_lazy(store, optimizer) -> None:
    """Records in a Keras weights file (``.keras`` / ``.weights.h5``) whether the state is LazyAdam's."""
    if hasattr(store, "attrs"):  # an HDF5 group; plain Keras ignores attributes
        store.attrs[_LAZY_MARK] = isinstance(optimizer, LazyAdam)


def _check_lazy(store, optimizer) -> None:
    """Refuses LazyAdam state into Adam and the reverse: same slots, different meaning of their rows."""
    if not hasattr(store, "attrs") or not isinstance(optimizer, tf.keras.optimizers.Adam):
        return
    saved_lazy = bool(store.attrs.get(_LAZY_MARK, False))
    if saved_lazy != isinstance(optimizer, LazyAdam):
        saved, mine = ("LazyAdam", "Adam") if saved_lazy else ("Adam (or another optimizer)", "LazyAdam")
        raise keras_slots.OptimizerLayoutError(
            f"the file holds {saved}'s optimizer state and this model's optimizer is {mine}: LazyAdam's moments "
            "of rows absent from a batch never decayed, Adam's did, so loading would continue with moments that "
            "mean something else. Compile with the optimizer that wrote the file, or compile after loading to "
            "start the optimizer afresh on purpose."
        )
