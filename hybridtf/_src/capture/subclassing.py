"""Per-instance behaviour without global patching: run-time subclasses.

hybridtf changes one object (a layer, a model, an optimizer) by giving it a
class of its own: a subclass of its class, made at run time, with a mixin in
front. The subclass keeps the original class's name, module and Keras
registration, so configs and saved models still name the original class and
load without hybridtf. Nothing in TensorFlow or Keras is patched.
"""

from __future__ import annotations

_CACHE: dict[tuple[type, type], type] = {}


def runtime_subclass(mixin: type, cls: type) -> type:
    """The (cached) subclass ``(mixin, cls)`` that presents itself as ``cls``.

    Args:
        mixin: the class whose methods take precedence.
        cls: the object's current class.

    Returns:
        A subclass named like ``cls`` (same ``__name__`` and ``__module__``),
        carrying ``cls``'s Keras serialization name if it has one.

    Example:
        >>> layer.__class__ = runtime_subclass(_HybridEmbeddingMixin, type(layer))
    """
    key = (mixin, cls)
    if key not in _CACHE:
        sub = type(cls.__name__, (mixin, cls), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
        from keras.src.saving import object_registration

        registered = object_registration._GLOBAL_CUSTOM_NAMES.get(cls)
        if registered is not None:  # keep a registered class's serialized name
            object_registration._GLOBAL_CUSTOM_NAMES[sub] = registered
        _CACHE[key] = sub
    return _CACHE[key]
