"""The autograd sequence number the capture reads before a call (grad_capture.next_sequence_nr)."""

from __future__ import annotations

import torch

from torchparity.capture import grad_capture
from torchparity.capture.module_tracker import _sequence_nr


def _next_node_seq() -> int:
    x = torch.ones(2, requires_grad=True)
    return (x * 2).grad_fn._sequence_nr()


def test_next_sequence_nr_is_the_next_nodes_number() -> None:
    for read in (grad_capture.next_sequence_nr, grad_capture._probe_sequence_nr, _sequence_nr):
        before = read()
        assert _next_node_seq() >= before
        # and every node made before the read has a smaller number
        x = torch.ones(2, requires_grad=True)
        y = x * 3
        after = read()
        assert y.grad_fn._sequence_nr() < after


def test_reading_the_counter_makes_no_node() -> None:
    """Where torch exposes the counter, reading it changes no node's number (the user's autograd
    numbering is left as it is)."""
    if grad_capture._peek_sequence_nr is None:  # pragma: no cover - torch without the binding
        return
    a = grad_capture.next_sequence_nr()
    b = grad_capture.next_sequence_nr()
    assert a == b == _next_node_seq()
