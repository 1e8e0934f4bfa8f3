"""Where an op runs, for online compare: the op stream's names, and the compare's own steps.

The op stream (:mod:`torchparity.capture.op_stream`) works out once per op what every consumer
names it by: its dump-style record name (``call.name``, ``Aten.mm.3.forward``: the same name the
dump, the NaN/Inf screen and the emulated device's fault indices use), its phase (``call.phase``)
and its module (``call.where()``: the innermost running module in forward, the module whose
forward created the autograd node in backward). Online compare reads those; what it keeps itself
is its *step number* (:class:`OpLocator`), because ``start_step``/``end_step`` count from the
moment the compare started, whoever else was already on the stream.

Steps end for everybody at once: the stream ends a step on the first optimizer's ``step()`` or on
:meth:`~torchparity.capture.op_stream.OpStream.next_step` (which
:meth:`CompareWithReference.step() <torchparity.online.compare.CompareWithReference.step>` calls),
and every consumer (a dump running alongside included) sees the same step end. In *manual* mode
(the torch_musa façade, whose steps advance only on its own ``step()``) the compare's step number
advances only on :meth:`OpLocator.next_step`, which ends the stream's step too unless an
optimizer step already did since the last one (so a dump alongside sees no empty steps).
"""

from __future__ import annotations

from ..capture.op_stream import op_stream


class OpLocator:
    """The online compare's step number over the op stream (see the module doc)."""

    def __init__(self, manual: bool = False) -> None:
        self.step = 0
        #: steps advance only on :meth:`next_step` (never on the stream's own step ends)
        self.manual = manual
        self._stream_ended = False

    def stream_step_ended(self) -> None:
        """The stream ended a step (called from the consumer's ``on_step_end``)."""
        if self.manual:
            self._stream_ended = True
        else:
            self.step += 1

    def next_step(self) -> None:
        """End the step by hand: the stream's step ends for every consumer (in manual mode only
        when no stream step ended since the last call), and the compare's step advances."""
        if not self.manual:
            op_stream().next_step()  # comes back through stream_step_ended
            return
        ended, self._stream_ended = self._stream_ended, False
        if not ended:
            op_stream().next_step()
        self._stream_ended = False
        self.step += 1
