"""The protocol's reference, written from its records: a section per direction, a table
per op (``docs/protocol.md``, made by ``python -m hpcsched.core.protocol.messages``)."""

from __future__ import annotations

from collections.abc import Iterable

from hpcsched.core.protocol.checks import describe
from hpcsched.core.protocol.records import Field, fields
from hpcsched.core.protocol.wire import Direction, Spec, spec


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(f: Field) -> str:
    if f.required:
        return "required"
    text = f"`{f.example()!r}`"
    return f"{text}, left out" if f.sparse else text


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def markdown(
    title: str, intro: str, directions: Iterable[Direction], common: dict[str, str] | None = None
) -> str:
    """The protocol's reference: a section per direction, a table per op (field, check,
    required or default, meaning). ``common``: meanings of fields that recur (a field's
    own ``doc`` wins)."""
    common = common or {}
    out = [f"# {title}", "", intro.strip(), ""]
    for d in directions:
        out += [f"## {d.name}", ""]
        if d.doc:
            out += [d.doc.strip(), ""]
        if not d.checked:
            out += [
                "Field values are not checked on arrival (only the op and the field names).",
                "",
            ]
        for op in sorted(d):
            s = spec(d[op])
            out += [f"### `{op}`", "", f"`{s.cls.__name__}`: {_first_paragraph(s.cls.__doc__)}", ""]
            rows = [
                (
                    f"`{f.name}`",
                    _cell(describe(f.check) if f.check else ""),
                    _default(f),
                    _cell(f.doc or common.get(f.name, "")),
                )
                for f in s.wire
            ]
            if s.extra is not None:
                rows.append(("*others*", "any", "optional", _extra_doc(s)))
            if rows:
                out += [
                    "| field | type | required / default | meaning |",
                    "| --- | --- | --- | --- |",
                ]
                out += [f"| {' | '.join(r)} |" for r in rows]
            else:
                out.append("No fields.")
            if s.context:
                names = ", ".join(f"`{f.name}`" for f in s.context)
                out += ["", f"Filled in by the receiver (not sent): {names}."]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _extra_doc(s: Spec) -> str:
    f = next(f for f in fields(s.cls) if f.name == s.extra)
    return _cell(f.doc)
