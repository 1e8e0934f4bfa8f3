"""Online tools: check ops while the model runs.

* :class:`~torchparity.online.compare.CompareWithReference` (alias ``CompareWithCPU``): every op
  against a reference backend, judged fairly, failures saved as replayable cases.
* :func:`~torchparity.online.replay.replay`: re-run one saved failure case.
* :class:`~torchparity.online.locate.OpLocator`: step/phase/module tracking and dump-style op
  names, shared by the online tools.

Import the submodules directly (or use the lazy names on :mod:`torchparity`); this package
imports nothing heavy by itself.
"""
