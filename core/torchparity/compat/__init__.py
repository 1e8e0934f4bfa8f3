"""Drop-in entry points for users of other numerics-debugging tools.

Change one import line and keep working; the work is done by torchparity's own engine (dump,
compare, overflow checker, online compare, NaN/Inf tracker). Nothing here is a second
implementation: each façade translates the other tool's parameters into torchparity options.

* :mod:`torchparity.compat.msprobe` — ``from msprobe.pytorch import PrecisionDebugger, compare``
* :mod:`torchparity.compat.maca` — ``from maca_tools import accuracy``
* :mod:`torchparity.compat.torch_musa` — ``from torch_musa.utils.compare_tool import ...``

See ``docs/migrating.md`` for each tool's examples next to the torchparity-native equivalent.
"""
