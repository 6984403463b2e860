"""Typed JSON tables that are written back as they were read.

A table of a JSON document (the bundle manifest and its sections) is a frozen dataclass:
its fields are the keys tandem reads, typed, and what else the document says is kept
beside them, so that a document read and written again (json.dump with sort_keys) is the
same bytes, whatever of it tandem knows. What the typed values alone do not say:

- `extra`: the keys tandem does not read (a later tandem's, a tool's), kept as they were;
- `nulls`: the known keys that are null (a null and an absent key are both None here);
- `absent`: the nested tables that are absent (their field holds an empty one).

A field is written under its name, or under metadata["key"]; `one`, `optional`,
`listed`, `named` and `texts` declare the nested ones. A table tandem makes is written
from its values: a None is left out, unless its key is in the class's default `nulls`
(a manifest says `"wall_time_s": null` until it is sealed). Both sets keep only the keys
whose value is empty, so a table equals the one its own JSON reads back as.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Self, TypeVar

Json = Any          # a decoded JSON value: dict, list, str, int, float, bool or None
T = TypeVar("T", bound="Table")
BOOKKEEPING = ("nulls", "absent", "extra")


@dataclasses.dataclass(frozen=True)
class Table:
    """The base of a typed JSON table (the module's docstring says how it round-trips)."""
    nulls: frozenset[str] = dataclasses.field(default=frozenset(), kw_only=True, repr=False)
    absent: frozenset[str] = dataclasses.field(default=frozenset(), kw_only=True, repr=False)
    extra: Mapping[str, Json] = dataclasses.field(default_factory=dict, kw_only=True, repr=False)

    def __post_init__(self) -> None:
        fields = _fields(type(self))
        empty = {key for key, f in fields.items() if _is_empty(f, getattr(self, f.name))}
        nested = {key for key, f in fields.items() if "empty" in f.metadata}
        object.__setattr__(self, "nulls", frozenset(self.nulls & empty))
        object.__setattr__(self, "absent", frozenset(self.absent & empty & nested))

    @classmethod
    def from_json(cls, table: Mapping[str, Json]) -> Self:
        """The table a JSON object says (its shape checked already: formats.bundle.manifest_problem)."""
        values: dict[str, Any] = {}
        fields = _fields(cls)
        for key, f in fields.items():
            if table.get(key) is not None:
                load: Callable[[Json], Any] | None = f.metadata.get("load")
                values[f.name] = load(table[key]) if load else table[key]
        return cls(**values, nulls=frozenset(k for k in fields if k in table and table[k] is None),
                   absent=frozenset(k for k in fields if k not in table),
                   extra={k: v for k, v in table.items() if k not in fields})

    def to_json(self) -> dict[str, Json]:
        """The JSON object of this table: what it was read from, with what has changed
        since; its keys sorted."""
        out: dict[str, Json] = {}
        for key, f in _fields(type(self)).items():
            value = getattr(self, f.name)
            if key in self.nulls:
                out[key] = None
            elif value is not None and key not in self.absent:
                dump: Callable[[Any], Json] | None = f.metadata.get("dump")
                out[key] = dump(value) if dump else value
        out.update(self.extra)
        return dict(sorted(out.items()))      # in the order manifest.json has them (sort_keys)

    def json_of(self, key: str) -> Json:
        """What this table writes under key: None if it writes nothing there, or a null."""
        return self.to_json().get(key)


_FIELDS: dict[type[Table], dict[str, dataclasses.Field[Any]]] = {}


def _fields(cls: type[Table]) -> dict[str, dataclasses.Field[Any]]:
    """JSON key -> field, of the keys the table reads."""
    if cls not in _FIELDS:
        _FIELDS[cls] = {f.metadata.get("key") or f.name: f for f in dataclasses.fields(cls)
                        if f.name not in BOOKKEEPING}
    return _FIELDS[cls]


def _is_empty(f: dataclasses.Field[Any], value: Any) -> bool:
    make_empty: Callable[[], Any] | None = f.metadata.get("empty")
    return value is None or (make_empty is not None and value == make_empty())


def one(cls: type[T], *, key: str | None = None) -> Any:
    """A nested table that is always written (an empty one when the document has none)."""
    return dataclasses.field(default_factory=cls, metadata={
        "key": key, "empty": cls, "load": cls.from_json, "dump": cls.to_json})


def optional(cls: type[T], *, key: str | None = None) -> Any:
    """A nested table that may be absent (None)."""
    return dataclasses.field(default=None, metadata={"key": key, "load": cls.from_json, "dump": cls.to_json})


def listed(cls: type[T], *, key: str | None = None) -> Any:
    """A list of tables, as a tuple (None: absent)."""
    return dataclasses.field(default=None, metadata={
        "key": key, "load": lambda items: tuple(cls.from_json(t) for t in items),
        "dump": lambda items: [t.to_json() for t in items]})


def named(cls: type[T], *, key: str | None = None) -> Any:
    """A table of tables by name (files, inputs, channels), a name's table possibly null."""
    return dataclasses.field(default_factory=dict, metadata={
        "key": key, "empty": dict,
        "load": lambda table: {k: None if t is None else cls.from_json(t) for k, t in table.items()},
        "dump": lambda table: {k: None if t is None else t.to_json() for k, t in table.items()}})


def texts(*, key: str | None = None) -> Any:
    """A list of strings, as a tuple (None: absent)."""
    return dataclasses.field(default=None, metadata={"key": key, "load": tuple, "dump": list})


def renamed(key: str) -> Any:
    """A plain value under another JSON key than its field's name."""
    return dataclasses.field(default=None, metadata={"key": key})
