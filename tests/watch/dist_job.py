"""One rank of a 2-rank gloo job under torchparity.watch (run by test_watch_dist.py)::

    python dist_job.py RANK WORLD INIT OUT

Rank 1's batch at step 3 drives the model's ``guard`` (sqrt) into NaN; rank 0 stays finite. Each
step all-reduces a counter (ranks run in lockstep, so a replay must run on every rank). Writes the
watch reports under ``OUT`` and ``OUT/result.rank{R}.json``: the triggers this rank saw.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import torchparity

_spec = importlib.util.spec_from_file_location("watch_helpers", Path(__file__).with_name("helpers.py"))
_h = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_h)


def main() -> None:
    rank, world, init, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    model = _h.guarded()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    inner = _h.stepper(model, opt)

    def step(batch):
        loss = inner(batch)
        dist.all_reduce(torch.ones(1))  # lockstep: a rank replaying alone would hang here
        return loss

    data = _h.batches(6, bad=3 if rank == 1 else None)
    with torchparity.watch(model, opt, output_dir=out, every=2, on_trigger="continue") as w:
        for b in data:
            w.run(step, b)
    (out / f"result.rank{rank}.json").write_text(json.dumps([t.kind for t in w.triggers]))
    # leave together: a rank tearing gloo down while its peer still talks aborts the peer
    # ("terminate called without an active exception", once in the CI's newest job)
    dist.barrier()
    # and skip gloo's teardown: destroying the group (or its destructors at exit) while the peer's
    # connection closes still aborted one rank about once in five runs after a correct run
    # ("terminate called without an active exception", gloo's threads; results already written)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
