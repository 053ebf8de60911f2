"""Integer handles for the kernel objects that a registered torch operator calls.

An operator takes tensors and plain values, not Python objects, so each object is passed as its
handle. The table holds weak references: the object lives as long as its owner holds it (the
torch engine's parallel layers), and a call through a handle whose object is gone raises.
"""

import itertools
import weakref
from typing import Generic, TypeVar

__all__ = ["Handles"]

T = TypeVar("T")


class Handles(Generic[T]):
    """Handle -> object, without keeping the object alive; handles are never reused."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._objects: weakref.WeakValueDictionary[int, T] = weakref.WeakValueDictionary()
        self._next = itertools.count()

    def add(self, target: T) -> int:
        handle = next(self._next)
        self._objects[handle] = target
        return handle

    def get(self, handle: int) -> T:
        found = self._objects.get(handle)
        if found is None:
            raise RuntimeError(
                f"{self.kind} {handle} was released by its owner; keep the object (the model "
                "that holds it) alive while its operator is called"
            )
        return found

    def __len__(self) -> int:
        return len(self._objects)
