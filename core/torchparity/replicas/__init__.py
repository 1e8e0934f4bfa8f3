"""Replica checks that need no reference run: every data-parallel replica must hold the same
gradients after the all-reduce and the same parameters after the optimizer step.

* :class:`ReplicaCheck` (``torchparity.ReplicaCheck``): online, one all-gather per step;
* the dump option ``replica_check=True`` (:mod:`.recorder`): hashes recorded in the dump;
* :func:`check_replicas` (``torchparity replicas DIR``): offline, from a dump of any mode.
"""

from __future__ import annotations

from .hashing import ALGORITHM, stacked_hashes, tensor_hash
from .offline import ReplicaReport, check_replicas
from .online import ReplicaCheck, ReplicaMismatchError
from .vote import ReplicaFinding, vote

__all__ = ["ALGORITHM", "ReplicaCheck", "ReplicaFinding", "ReplicaMismatchError", "ReplicaReport",
           "check_replicas", "stacked_hashes", "tensor_hash", "vote"]
