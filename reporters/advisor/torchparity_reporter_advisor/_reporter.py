"""The advisor as a reporter: :class:`AdvisorReporter` checks its options and writes ``advisor.txt``.

The file is written to a temporary name and renamed into place, so a full disk never leaves half
a report; the text itself comes from :func:`~torchparity_reporter_advisor._advise.advise`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from torchparity.errors import PluginError
from torchparity.plugin_types import Reporter, prepare_output_dir, write_atomically

from ._advise import advise

if TYPE_CHECKING:  # pragma: no cover
    from torchparity.results import CompareResult


class AdvisorReporter(Reporter):
    """``OUT/advisor.txt``: where it diverged, why, and what to try next."""

    name = "advisor"
    description = "OUT/advisor.txt: root cause in plain words, the numbers, op-specific advice, how to replay"

    @dataclass
    class Options:
        #: file name inside the output directory
        filename: str = "advisor.txt"
        #: other suspects listed
        top_suspects: int = 5
        #: error rows listed when no root cause was named
        max_errors: int = 10
        #: line width for wrapping
        width: int = 100

    def configure(self, options: Mapping[str, Any] | None = None) -> None:
        super().configure(options)
        o = self.options
        if not o.filename or Path(o.filename).name != o.filename:
            raise PluginError(f"reporter 'advisor': option filename={o.filename!r} must be a plain file name")
        if int(o.top_suspects) < 0 or int(o.max_errors) < 0 or int(o.width) < 40:
            raise PluginError("reporter 'advisor': top_suspects and max_errors must be >= 0 and width >= 40")

    def write(self, result: CompareResult, output_dir: Path) -> list[Path]:
        """Write ``advisor.txt`` into ``output_dir``; return ``[path]``."""
        out = prepare_output_dir(output_dir, self.name)
        text = advise(result, top_suspects=int(self.options.top_suspects), max_errors=int(self.options.max_errors),
                      width=int(self.options.width))
        path = out / self.options.filename
        # a temporary file renamed into place: a full disk never leaves half a file
        write_atomically(path, path.with_name(path.name + ".tmp"), "advisor",
                         lambda tmp: tmp.write_text(text, encoding="utf-8"))
        return [path]
