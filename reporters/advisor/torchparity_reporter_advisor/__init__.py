"""torchparity advisor: writes ``OUT/advisor.txt``, a diagnosis in plain words.

It says where the run diverged (step, rank, op, module, phase), why that op is the suspect (its
input error against its output error, the amplification, its metrics), which other ops are
suspects, what to try next for that kind of op (matmul/conv precision modes, normalisation eps,
softmax in low precision, fp16 overflow, randomness, non-deterministic kernels, collectives) and
how to reproduce the op alone (``torchparity replay``).

It never says "all OK" when a row is an error: when there are errors but no root cause it lists
them (msprobe 8.3.3's advisor printed "All data ... meets the accuracy requirements" next to 66
red cells).

:func:`advise` returns the text; the reporter writes it. Nothing heavy is imported at module level.

This module is the plugin's entry point: it holds the pluggy hook implementation and re-exports
the public names. The work is done in:

``_families``
    op families (:func:`op_base`, :func:`family_of`, :data:`FAMILIES`) and their advice
``_advise``
    :func:`advise`, the diagnosis text, and :data:`DTYPE_EPS`
``_rows``
    reading the comparison's rows and summary (counts, root-cause rows, replay case)
``_text``
    number formatting (:func:`fmt`) and the wrapped plain-text document
``_reporter``
    :class:`AdvisorReporter`, which writes ``advisor.txt``
"""

from __future__ import annotations

from typing import Iterator

from torchparity import hookimpl
from torchparity.plugin_types import Reporter

from ._advise import DTYPE_EPS, advise
from ._families import FAMILIES, GENERIC_ADVICE, Family, family_of, op_base
from ._reporter import AdvisorReporter
from ._rows import first_divergence
from ._text import fmt

__version__ = "0.1.0"

__all__ = [
    "DTYPE_EPS", "FAMILIES", "GENERIC_ADVICE", "AdvisorReporter", "Family", "advise", "family_of",
    "first_divergence", "fmt", "op_base", "torchparity_reporters",
]


@hookimpl
def torchparity_reporters() -> Iterator[Reporter]:
    yield AdvisorReporter()
