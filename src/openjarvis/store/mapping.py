"""Where a table's row and a record meet: by field name, with no list of fields written twice.

A record field is either a column of its table with the same name, or one the caller names as
stored elsewhere (a relationship, a joined table); any other field is refused when the module
that maps it is imported, so a field added to a record cannot silently go unstored.
"""

from collections.abc import Iterable, Mapping
from dataclasses import fields
from functools import cache
from typing import Any, get_origin, get_type_hints

from sqlalchemy import inspect

__all__ = ["column_values", "field_values", "shared_names"]


def shared_names(
    table: type, record: type, elsewhere: Iterable[str] = (), prefix: str = ""
) -> tuple[str, ...]:
    """The columns of `table` that are fields of `record` (named `prefix` + column there).

    Without a prefix, every field of `record` must be such a column or be named in `elsewhere`.
    """
    columns: list[str] = inspect(table).columns.keys()
    names = _field_names(record)
    shared = tuple(column for column in columns if prefix + column in names)
    if not prefix:
        unmapped = set(names) - set(shared) - set(elsewhere)
        if unmapped:
            raise TypeError(
                f"{record.__name__} has fields that {table.__name__} does not store: "
                f"{', '.join(sorted(unmapped))}; add a column (and a migration) for each"
            )
    return shared


def column_values(record: object, names: Iterable[str], prefix: str = "") -> dict[str, Any]:
    """Keyword arguments for a row from `record`: tuples become lists, as JSON columns keep them."""
    values = {name: getattr(record, prefix + name) for name in names}
    return {name: list(v) if isinstance(v, tuple) else v for name, v in values.items()}


def field_values(
    row: object, record: type, names: Iterable[str], prefix: str = ""
) -> dict[str, Any]:
    """Keyword arguments for `record` from a row: lists become tuples where the field is one."""
    tuples = _tuple_fields(record)
    values: dict[str, Any] = {}
    for name in names:
        value = getattr(row, name)
        values[prefix + name] = tuple(value) if prefix + name in tuples else value
    return values


@cache
def _field_names(record: type) -> Mapping[str, object]:
    hints = get_type_hints(record)  # resolves string annotations too
    return {f.name: hints[f.name] for f in fields(record)}


@cache
def _tuple_fields(record: type) -> frozenset[str]:
    return frozenset(
        name for name, kind in _field_names(record).items() if get_origin(kind) is tuple
    )
