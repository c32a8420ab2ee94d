"""Loading without drawing: the weights a checkpoint sets are never initialized first.

`from_preset` builds a model, then loads a checkpoint over its weights; drawing their initial
values first was wasted work (1.5 s of a BERT-base backbone's 1.9 s build on TensorFlow). The
loaders build and load inside `deferred_initialization()`, which is Keras' own deferred
initialization (`keras.StatelessScope`): a variable created in the scope keeps its initializer
and gets no value, and every `assign` in the scope (`checkpoints.assign`, Keras'
`load_weights`) is recorded by the scope instead of applied. When the scope closes, Keras
initializes every variable created in it: here those assigned from the value last assigned,
the others by calling their initializer. Those draw what they draw today: our
`TruncatedNormal` and Keras' initializers draw from an integer seed fixed when the initializer
was made (an unseeded one gets it then), so a later draw gives the same values. A variable the loader does not set (a
checkpoint without the pooler, a new task head, a weight a loader forgot) therefore gets its
initial values, and none is left without a value.
"""
import contextlib
import functools
import inspect
import threading

import keras
import numpy as np

_ACTIVE = threading.local()  # the DeferredInitialization open in this thread, if any


class _Assigned:
    """The initializer of a deferred variable that was assigned in the scope: the value
    assigned. TensorFlow copies it into the variable and JAX arrays are immutable; torch
    would keep the tensor itself as the variable's storage (the checkpoint's array, possibly
    read-only or transposed, or another variable's), so it gets a copy, contiguous as an
    assignment's."""

    def __init__(self, value):
        self.value = value

    def __call__(self, shape, dtype=None):
        if keras.backend.backend() == "torch":
            return np.array(keras.ops.convert_to_numpy(self.value), order="C")
        return self.value


def _deferred(variable):
    """Whether `variable` was created in a stateless scope and is still waiting for its value
    (Keras keeps the initializer on such a variable until `_deferred_initialize`)."""
    return getattr(variable, "_value", None) is None and getattr(
        variable, "_initializer", None) is not None


class DeferredInitialization(keras.StatelessScope):
    """A `keras.StatelessScope` whose assignments become the initial values of the variables
    created in it; variables created before it are assigned when it closes."""

    def __init__(self):
        super().__init__()
        self._assigned = {}

    def __enter__(self):
        _ACTIVE.scope = self
        return super().__enter__()

    def add_update(self, update):
        super().add_update(update)
        variable, value = update
        self._assigned[id(variable)] = (variable, value)

    def __exit__(self, *args, **kwargs):
        _ACTIVE.scope = None
        existing = []
        for variable, value in self._assigned.values():
            if _deferred(variable):
                variable._initializer = _Assigned(value)
            else:
                existing.append((variable, value))
        # Each value is now held by its variable's initializer only, and freed once drawn.
        self._assigned, self.state_mapping = {}, {}
        # Keras initializes every variable created in the scope (`initialize_all_variables`).
        super().__exit__(*args, **kwargs)
        for variable, value in existing:
            variable.assign(value)


def deferred_initialization(enabled=True):
    """The scope a loader builds and loads in; a no-op scope when not `enabled` or inside
    another loader's (`convert_task` calls `from_preset`: the outer scope initializes)."""
    if not enabled or getattr(_ACTIVE, "scope", None) is not None:
        return contextlib.nullcontext()
    return DeferredInitialization()


def deferring(function):
    """Runs a loading function (`load_weights=` among its arguments, default True) inside
    `deferred_initialization`, unless it does not load weights."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        load_weights = signature.bind(*args, **kwargs).arguments.get("load_weights", True)
        with deferred_initialization(bool(load_weights)):
            return function(*args, **kwargs)

    return wrapper
