"""Per-instance behaviour without global patching: run-time subclasses.

hybridtf changes one object (a layer, a model, an optimizer) by giving it a
class of its own: a subclass of its class, made at run time, with a mixin in
front. The subclass keeps the original class's name, module, Keras
registration and public Keras path, so configs and saved models still name
the original class and load without hybridtf. Nothing in TensorFlow or Keras is patched.
"""

from __future__ import annotations

_CACHE: dict[tuple[type, type, type | None, bool], type] = {}  # (mixin, cls, behind, public_path)


def plain_class(cls: type) -> type:
    """The class under ``cls``'s run-time subclasses and their mixins (e.g. ``Functional``, ``Embedding``)."""
    made = set(_CACHE.values())
    mixins = {base for mixin, *_ in _CACHE for base in mixin.__mro__ if base is not object}
    return next(c for c in cls.__mro__ if c not in made and c not in mixins)


class PlainConstruction:
    """Mixin base: constructing a run-time subclass builds an instance of the plain class.

    hybridtf's changes belong to one instance. Code that makes a new object
    from an existing one's class (Keras ``clone_model`` calls
    ``model.__class__(inputs, outputs)``, ``Layer.from_config`` calls
    ``cls(**config)``) gets a plain object, which ``optimize`` can pack
    again. A call without arguments (``copy``'s ``cls.__new__(cls)``) and
    classes derived from a run-time subclass (Horovod's optimizer wrapper)
    are constructed as usual.
    """

    def __new__(cls, *args, **kwargs):
        if (args or kwargs) and cls in _CACHE.values():
            return plain_class(cls)(*args, **kwargs)
        following = super().__new__
        if following is object.__new__:
            return object.__new__(cls)
        return following(cls, *args, **kwargs)


def runtime_subclass(mixin: type, cls: type, behind: type | None = None, public_path: bool = True) -> type:
    """The (cached) subclass ``(mixin, cls)`` that presents itself as ``cls``.

    Args:
        mixin: the class whose methods take precedence.
        cls: the object's current class.
        behind: a base class of ``cls``. If given, the mixin takes precedence
            over ``behind`` only, not over the classes between ``cls`` and it:
            the subclass is ``(cls, (mixin, behind))``, so a user's subclass
            that overrides a method and calls ``super()`` reaches the mixin's
            version where it would have reached ``behind``'s.
        public_path: keep ``cls``'s public Keras path (``keras.layers.Embedding``),
            so that the subclass serializes as ``cls``; False for a subclass that
            registers a name of its own for Keras to load it by.

    Returns:
        A subclass named like ``cls`` (same ``__name__`` and ``__module__``),
        carrying ``cls``'s Keras serialization name if it has one, and its
        public Keras path if it is a Keras class (``public_path``).

    Example:
        >>> layer.__class__ = runtime_subclass(_HybridEmbeddingMixin, type(layer))
    """
    key = (mixin, cls, behind, public_path)
    if key not in _CACHE:
        bases = (mixin, cls)
        if behind is not None:
            inner = type(f"{mixin.__name__}_{behind.__name__}", (mixin, behind), {"__module__": mixin.__module__})
            bases = (cls, inner)
        names = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        # A Keras class's public path (`keras.layers.Embedding`) is read from the class's own __dict__ (the
        # export decorator's attributes): with it, get_config / to_json serialize the subclass as the class.
        if public_path:
            names.update({k: v for k, v in vars(cls).items() if k.startswith("_keras_api_names")})
        sub = type(cls.__name__, bases, names)
        from keras.src.saving import object_registration

        registered = object_registration._GLOBAL_CUSTOM_NAMES.get(cls)
        if registered is not None:  # keep a registered class's serialized name
            object_registration._GLOBAL_CUSTOM_NAMES[sub] = registered
        _CACHE[key] = sub
    return _CACHE[key]
