"""DuckDB type names as trees (standard library only: the cluster worker imports it).

A result's column types arrive as DuckDB writes them (``DECIMAL(15,2)``,
``INTEGER[]``, ``STRUCT(x INTEGER, "y z" VARCHAR[])``, ``MAP(VARCHAR,
INTEGER)``, ``INTEGER[3]``). :func:`parse_type` turns such a name into a
:class:`DuckType` tree, so that the worker can encode nested values and the
gateway can name the same type in Trino's terms.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["DuckType", "parse_type"]


@dataclass(frozen=True)
class DuckType:
    """One DuckDB type.

    Attributes:
        name: upper case: a scalar's name (``INTEGER``, ``TIMESTAMP WITH TIME
            ZONE``, ``DECIMAL``, ``ENUM``), or ``LIST``, ``ARRAY`` (fixed
            length), ``STRUCT``, ``MAP``, ``UNION``.
        children: the element type (``LIST``, ``ARRAY``), key and value
            (``MAP``), each field's type (``STRUCT``, ``UNION``).
        fields: the field names of ``STRUCT`` / ``UNION``, in order.
        params: ``DECIMAL``'s precision and scale; ``ARRAY``'s length.
    """

    name: str
    children: tuple[DuckType, ...] = ()
    fields: tuple[str, ...] = ()
    params: tuple[int, ...] = ()


class _Reader:
    def __init__(self, text: str) -> None:
        self.text, self.i = text, 0

    def peek(self) -> str:
        while self.i < len(self.text) and self.text[self.i].isspace():
            self.i += 1
        return self.text[self.i] if self.i < len(self.text) else ""

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise ValueError(f"expected {char!r} at {self.i} in DuckDB type {self.text!r}")
        self.i += 1

    def word(self) -> str:
        """A name up to the next ``(``, ``)``, ``,``, ``[`` or ``]`` (spaces inside kept: ``TIME WITH TIME ZONE``)."""
        self.peek()
        start = self.i
        while self.i < len(self.text) and self.text[self.i] not in "(),[]":
            self.i += 1
        return self.text[start:self.i].strip()

    def field_name(self) -> str:
        if self.peek() == '"':
            self.i += 1
            out = []
            while self.i < len(self.text):
                char = self.text[self.i]
                if char == '"':
                    if self.text[self.i + 1:self.i + 2] == '"':
                        out.append('"')
                        self.i += 2
                        continue
                    self.i += 1
                    return "".join(out)
                out.append(char)
                self.i += 1
            raise ValueError(f"unterminated field name in DuckDB type {self.text!r}")
        start = self.i
        while self.i < len(self.text) and not self.text[self.i].isspace():
            self.i += 1
        return self.text[start:self.i]

    def type(self) -> DuckType:
        name = self.word().upper()
        if name in ("STRUCT", "UNION"):
            self.expect("(")
            names, kinds = [], []
            while True:
                names.append(self.field_name())
                kinds.append(self.type())
                if self.peek() == ",":
                    self.i += 1
                    continue
                self.expect(")")
                break
            out = DuckType(name, tuple(kinds), tuple(names))
        elif name == "MAP":
            self.expect("(")
            key = self.type()
            self.expect(",")
            value = self.type()
            self.expect(")")
            out = DuckType("MAP", (key, value))
        elif self.peek() == "(":  # DECIMAL(15,2), ENUM('a', 'b'), VARCHAR(10): numbers kept, the rest skipped
            depth, start = 0, self.i
            while self.i < len(self.text):
                char = self.text[self.i]
                depth += (char == "(") - (char == ")")
                self.i += 1
                if depth == 0:
                    break
            inner = self.text[start + 1:self.i - 1]
            params = tuple(int(p) for p in inner.split(",") if p.strip().isdigit()) if name == "DECIMAL" else ()
            out = DuckType(name, params=params)
        else:
            out = DuckType(name)
        while self.peek() == "[":  # INTEGER[] (a list) or INTEGER[3] (a fixed-length array), possibly nested
            self.i += 1
            size = self.word()
            self.expect("]")
            out = DuckType("ARRAY", (out,), params=(int(size),)) if size else DuckType("LIST", (out,))
        return out


@functools.lru_cache(maxsize=1024)
def parse_type(text: str) -> DuckType:
    """The tree of a DuckDB type name.

    Raises:
        ValueError: the name is not one DuckDB writes.
    """
    reader = _Reader(text)
    out = reader.type()
    if reader.peek():
        raise ValueError(f"unexpected text at {reader.i} in DuckDB type {text!r}")
    return out
