"""Rows and records meet by field name (store/mapping.py): a record field with no column is
refused when its table is mapped, and tuples travel as JSON lists and come back as tuples."""

from dataclasses import dataclass

import pytest
from sqlalchemy import JSON, Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from openjarvis.store.mapping import column_values, field_values, shared_names


class _Base(DeclarativeBase):
    pass


class _Row(_Base):
    __tablename__ = "row"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(16))
    parts: Mapped[list[str]] = mapped_column(JSON)


@dataclass(frozen=True, slots=True)
class _Record:
    name: str
    parts: tuple[str, ...]
    children: tuple[int, ...] = ()  # a relationship in a real table


@dataclass(frozen=True, slots=True)
class _Owned:
    owner_name: str
    owner_parts: tuple[str, ...]
    name: str


def test_a_field_without_a_column_is_refused_with_its_name() -> None:
    with pytest.raises(TypeError, match=r"_Record has fields that _Row does not store: children"):
        shared_names(_Row, _Record)


def test_fields_named_as_stored_elsewhere_are_left_to_the_caller() -> None:
    assert shared_names(_Row, _Record, elsewhere={"children"}) == ("name", "parts")


def test_tuples_go_in_as_lists_and_come_back_as_tuples() -> None:
    names = shared_names(_Row, _Record, elsewhere={"children"})
    values = column_values(_Record("a", ("x", "y"), (1,)), names)
    assert values == {"name": "a", "parts": ["x", "y"]}
    row = _Row(**values)
    assert field_values(row, _Record, names) == {"name": "a", "parts": ("x", "y")}


def test_a_prefix_maps_a_joined_rows_columns_onto_prefixed_fields() -> None:
    # _Owned's owner_* fields are the columns of _Row named without the prefix; the others of
    # _Owned are not checked here, as the prefix maps only part of a record.
    names = shared_names(_Row, _Owned, prefix="owner_")
    assert names == ("name", "parts")
    row = _Row(name="n", parts=["p"])
    assert field_values(row, _Owned, names, prefix="owner_") == {
        "owner_name": "n",
        "owner_parts": ("p",),
    }
