"""The one way this package changes what a model computes for a while.

Every probe and method registers its changes on an :class:`Interventions` object: forward
pre-hooks and forward hooks on modules, attribute overrides (a module's ``forward``, a config
field), and any other undo step. Leaving the ``with`` block, normally or through an exception,
undoes everything in reverse order.

Stacking rules:

* hooks stack: several interventions may hook the same module; PyTorch runs them in the order
  they were registered;
* an attribute belongs to one intervention at a time: overriding an attribute that another live
  intervention has overridden raises ``RuntimeError`` (the second would restore the first's value);
* a RoPE patch is one per model (:class:`~lpes_nb.core.rope.RopePatch` refuses a second).

Hooks and overrides are global state on the model: everything that runs the model inside the
block, other threads included, sees them.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

_MISSING = object()
_OVERRIDDEN: set[tuple[int, str]] = set()  # (id(obj), name) of every live override


class Stop(Exception):
    """Raised by :meth:`Interventions.stop_after`'s hook: the rest of the forward is not computed."""


class Interventions:
    """Hooks and overrides with guaranteed removal (see the module docstring for stacking)."""

    def __init__(self):
        self._undo: list[Callable[[], None]] = []

    @property
    def active(self) -> bool:
        return bool(self._undo)

    def add(self, undo: Callable[[], None]) -> None:
        """Register an undo step for a change made by the caller."""
        self._undo.append(undo)

    def pre_hook(self, module: nn.Module, fn, with_kwargs: bool = False) -> None:
        self.add(module.register_forward_pre_hook(fn, with_kwargs=with_kwargs).remove)

    def hook(self, module: nn.Module, fn, always_call: bool = False) -> None:
        self.add(module.register_forward_hook(fn, always_call=always_call).remove)

    def override(self, obj, name: str, value) -> None:
        """Set ``obj.name = value`` until the block ends; then restore the old value (or delete the
        attribute if ``obj`` did not have its own, e.g. a module's ``forward``)."""
        key = (id(obj), name)
        if key in _OVERRIDDEN:
            raise RuntimeError(f"{type(obj).__name__}.{name} is already overridden by another live intervention")
        own = vars(obj) if hasattr(obj, "__dict__") else {}
        if name in own or hasattr(getattr(type(obj), name, None), "__set__"):
            previous = own[name] if name in own else getattr(obj, name)  # an instance value or a property's
        else:
            previous = _MISSING  # e.g. a module's forward: the class's, restored by deleting ours
        setattr(obj, name, value)
        _OVERRIDDEN.add(key)

        def undo():
            _OVERRIDDEN.discard(key)
            if previous is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, previous)

        self.add(undo)

    def stop_after(self, module: nn.Module, keep: Callable) -> None:
        """After ``module``'s forward, hand its output to ``keep`` and stop the model's forward by
        raising :class:`Stop` (catch it around the model call)."""

        def hook(_module, _args, output):
            keep(output)
            raise Stop

        self.hook(module, hook)

    def close(self) -> None:
        """Undo everything, newest first; every step runs even if one fails."""
        errors = []
        while self._undo:
            try:
                self._undo.pop()()
            except Exception as err:  # noqa: BLE001 - keep undoing, then report
                errors.append(err)
        if errors:
            raise errors[0]

    def __enter__(self) -> Interventions:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
