"""A named collection of declarations (attention types, head structures, experiments, ...).

Every extensible concept of attnflow is a registry of frozen declarations:
validation, the config schema, the docs and the engine all read the same
entries, and an unknown name is one ``ValueError`` that names it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Declarations keyed by their ``name`` attribute, in declaration order."""

    def __init__(self, kind: str, items: Iterable[T]):
        self.kind = kind
        self._items: dict[str, T] = {}
        for item in items:
            name = item.name
            if name in self._items:
                raise ValueError(f"{kind} {name!r} is declared twice")
            self._items[name] = item

    def get(self, name) -> T:
        """The declaration called ``name``; ``ValueError`` naming it (and the known ones) if none."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise ValueError(f"{self.kind} = {name!r}: unknown (known: {', '.join(self._items)})") from None

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and name in self._items

    def __iter__(self) -> Iterator[T]:
        return iter(self._items.values())

    def __len__(self) -> int:
        return len(self._items)
