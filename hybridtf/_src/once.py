"""Once-per-object notices: a warning said the first time a model, layer or optimizer shows a problem."""

from __future__ import annotations


def first_time(obj, flag: str) -> bool:
    """True the first time ``flag`` is asked about ``obj``, False every later time.

    Marks ``obj`` with the attribute ``flag`` through ``object.__setattr__``: Keras tracks attributes set on
    layers, models and optimizers (a tracked ``True`` would enter their checkpoints' dependencies), and this
    bypasses it. The mark lives as long as the object, so a rebuilt model is told again.
    """
    if getattr(obj, flag, False):
        return False
    object.__setattr__(obj, flag, True)
    return True
