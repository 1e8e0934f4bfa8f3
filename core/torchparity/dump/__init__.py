"""Dumping (capture) and reading torchparity dumps.

The reader (:mod:`torchparity.dump.reader`) imports without the capture engine; the capture API
lives in :mod:`torchparity.dump.api`.
"""
