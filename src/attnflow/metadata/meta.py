"""``Meta``: a variable's or coordinate's units, long name and description (CF style)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Meta:
    units: str
    long_name: str
    description: str

    def attrs(self) -> dict[str, str]:
        return {"units": self.units, "long_name": self.long_name, "description": self.description}


def _meta(value) -> Meta:
    """A ``Meta``, or the ``(units, long_name, description)`` an experiment may declare instead."""
    return value if isinstance(value, Meta) else Meta(*value)
