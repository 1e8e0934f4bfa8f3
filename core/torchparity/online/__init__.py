"""Online tools: check ops while the model runs.

* :class:`~torchparity.online.compare.CompareWithReference` (alias ``CompareWithCPU``): every op
  against a reference backend, judged fairly, failures saved as replayable cases.
* :func:`~torchparity.online.replay.replay`: re-run one saved failure case.
* :class:`~torchparity.online.locate.OpLocator`: online compare's step number over the op stream
  (which names ops, phases and modules once for every tool).

Import the submodules directly (or use the lazy names on :mod:`torchparity`); this package
imports nothing heavy by itself.
"""
