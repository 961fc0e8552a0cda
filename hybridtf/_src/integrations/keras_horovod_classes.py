"""Horovod's ``DistributedOptimizer`` classes, recognised and combined with hybridtf's optimizer hooks.

``hvd.DistributedOptimizer(opt)`` returns an instance of a class Horovod builds at run time from the
optimizer's class; its methods call ``super(self.__class__, self)``, so it cannot be subclassed the usual way.
"""

from __future__ import annotations

_HOROVOD_CLASSES: dict[tuple[type, type], type] = {}


def is_horovod_distributed(optimizer) -> bool:
    """Whether ``optimizer`` is a ``hvd.DistributedOptimizer`` (Horovod's run-time subclass of a Keras optimizer)."""
    return any(is_horovod_class(cls) for cls in type(optimizer).__mro__)


def is_horovod_class(cls) -> bool:
    """Whether ``cls`` is a class Horovod's ``DistributedOptimizer`` built."""
    return "_allreduce" in cls.__dict__ and "register_local_var" in cls.__dict__


def horovod_class_with(mixin: type, cls: type) -> type:
    """``mixin`` (one of hybridtf's optimizer hooks) under a ``hvd.DistributedOptimizer`` class ``cls``.

    Horovod's methods call ``super(self.__class__, self)``, so its class
    cannot be subclassed; like Horovod itself, this copies its methods into a
    new class whose bases put the mixin before the Keras optimizer.
    """
    if (mixin, cls) not in _HOROVOD_CLASSES:
        body = {k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")}
        _HOROVOD_CLASSES[mixin, cls] = type(cls.__name__, (mixin, *cls.__bases__), body)
    return _HOROVOD_CLASSES[mixin, cls]
