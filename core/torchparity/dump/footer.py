"""What a rank directory's ``footer.json`` says, for the reader and ``torchparity info``.

The writer (:mod:`torchparity.dump.writer`) ends every (step, rank) with ``footer.json``::

    {"complete": bool, "records": int, "dropped_records": int, "dropped_tensors": int,
     "tensor_bytes": int, "budget_exhausted": bool, "error": "one line", "interrupted": "one line"}

``error`` and ``interrupted`` are present only when something went wrong. :func:`read_footer`
turns that into one line for ``torchparity info`` (``state``: None when the rank is complete) and
the reader's warnings; lost data (records not written, a step interrupted, a footer missing or
damaged) is reported as :class:`~torchparity.dump.reader.Damage`. Tensors that were not saved
(a max_bytes budget, a tensor file the disk refused) are a plain warning: their entries keep
their statistics and the compare judges those rows on statistics only, never on a tensor it
does not have.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_COUNTS = ("records", "dropped_records", "dropped_tensors", "tensor_bytes")
_FLAGS = ("complete", "budget_exhausted")
_TEXTS = ("error", "interrupted")


@dataclass
class FooterReport:
    """One rank directory's footer, interpreted.

    :param state: None when the rank was closed cleanly and nothing was lost; otherwise why it
        is incomplete (one line, shown by ``torchparity info`` as ``INCOMPLETE (state)``).
    :param problems: the reader's warnings (:class:`~torchparity.dump.reader.Damage` for lost
        records or a missing/damaged footer; a plain ``str`` for tensors not saved).
    :param footer: the footer.json object (None when missing or damaged).
    """

    state: str | None = None
    problems: list[str] = field(default_factory=list)
    footer: dict[str, Any] | None = None


def kind_of(v: Any) -> str:
    """'an integer', 'a string' ... for messages about a JSON value of the wrong type."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def one_line(v: Any, limit: int = 300) -> str:
    """``v`` as one line of at most ``limit`` characters."""
    s = " ".join(str(v).split())
    return s if len(s) <= limit else s[:limit - 3] + "..."


def _field_problem(footer: dict[str, Any]) -> str | None:
    """The first field of the wrong type, as 'key' is ... (None when every field is valid)."""
    for k in _COUNTS:
        v = footer.get(k)
        if k in footer and not (type(v) is int and v >= 0):
            return f"'{k}' is {kind_of(v)} ({v!r:.40}), not a count"
    for k in _FLAGS:
        if k in footer and type(footer[k]) is not bool:
            return f"'{k}' is {kind_of(footer[k])} ({footer[k]!r:.40}), not true or false"
    for k in _TEXTS:
        if footer.get(k) is not None and type(footer[k]) is not str:
            return f"'{k}' is {kind_of(footer[k])} ({footer[k]!r:.40}), not a message"
    return None


def read_footer(rank_dir: Path, rel: str, n_records: int | None = None) -> FooterReport:
    """Interpret ``rank_dir/footer.json`` for a rank whose records.jsonl held ``n_records``
    (None: not counted; the footer's count is then not checked)."""
    from .damage import Damage

    path = rank_dir / "footer.json"
    if not path.is_file():
        return FooterReport("no footer: the run stopped early", [Damage(
            f"{rel}: no footer.json, the dump was not closed cleanly (process killed or crashed); "
            f"read {n_records} records, anything after the last flush is lost"
        )])
    try:
        footer: Any = json.loads(path.read_text(encoding="utf-8"))
        why = None if isinstance(footer, dict) else f"{rel}/footer.json holds {kind_of(footer)}, not an object"
    except (OSError, ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        text = str(exc).splitlines()[0] if str(exc) else ""
        why = f"{rel}/footer.json is unreadable ({type(exc).__name__}: {text:.120})"
    if why is None:
        bad = _field_problem(footer)
        why = f"{rel}/footer.json: {bad}" if bad else None
    if why is not None:
        return FooterReport("footer.json is damaged", [Damage(
            f"{why}; footer.json is damaged, so whether the dump was complete is unknown "
            f"(read {n_records} records) - re-run the dump")])
    rep = FooterReport(footer=footer)
    out = rep.problems
    error, stopped = footer.get("error"), footer.get("interrupted")
    lost_records = footer.get("dropped_records", 0)
    lost_tensors = footer.get("dropped_tensors", 0)
    # an error that cost tensors only: the writer went on with records and statistics
    tensor_only = bool(error) and lost_records == 0 and lost_tensors > 0 and "dropped_records" in footer
    states: list[str] = []
    if stopped:
        states.append(f"the step was interrupted: {one_line(stopped, 200)}")
        out.append(Damage(
            f"{rel}: the step was interrupted ({one_line(stopped)}); read the {n_records} records written "
            f"before it, the rest of the step did not run - compare what was read with --allow-partial"
        ))
    if error and not tensor_only:
        states.append(f"the dump writer stopped with an error: {one_line(error)}")
        lost = f", {lost_records} record(s) were not written" if lost_records else ""
        out.append(Damage(
            f"{rel}: the dump writer stopped with an error: {one_line(error)}; the {n_records} records "
            f"written before it were read{lost}, the rest of the run is not in the dump"
        ))
    elif lost_records:
        states.append(f"{lost_records} record(s) were not written")
        out.append(Damage(f"{rel}: footer.json says {lost_records} record(s) were not written; read "
                          f"{n_records} records - re-run the dump for the rest"))
    expected = footer.get("records")
    if type(expected) is int and n_records is not None and expected != n_records:
        states.append(f"footer.json says {expected} records, {n_records} were read")
        out.append(Damage(f"{rel}: footer.json says {expected} records but {n_records} were read; "
                          f"the file was altered or damaged"))
    if lost_tensors:
        if error and tensor_only:
            why_t = f"the dump writer could not save them ({one_line(error)})"
        elif error:
            why_t = "the dump writer failed"
        else:
            why_t = None
        if footer.get("budget_exhausted"):
            why_t = f"{why_t} or " if why_t else ""
            why_t += "the tensor budget (max_bytes) was exhausted"
        why_t = why_t or "footer.json gives no reason"
        states.append(f"{lost_tensors} tensor(s) not saved")
        out.append(f"{rel}: {lost_tensors} tensor(s) were not saved: {why_t}; their entries keep their "
                   f"statistics and are compared on statistics only")
    if footer.get("complete", True) is not True and not states:
        states.append("footer.json does not say complete")
        out.append(Damage(f"{rel}/footer.json: 'complete' is false: the dump was not closed cleanly; "
                          f"read {n_records} records"))
    rep.state = "; ".join(states) if states else None
    return rep
