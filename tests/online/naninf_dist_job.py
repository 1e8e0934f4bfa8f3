"""One rank of the 2-rank gloo DDP job of test_naninf_dist.py (run as a script, one process per
rank): rank 1 makes a NaN in fc1's output at step 1 (a forward hook); DDP's asynchronous bucket
all-reduce carries it into rank 0's gradients. The tracker runs on its host path, its device path
(forced on the CPU) or with light steps, per MODE; each rank writes OUT/MODE_rank{R}.json."""

import json
import logging
import sys

import torch
import torch.distributed as dist

import torchparity
from torchparity.compare._testing import ddp_mlp

logging.disable(logging.WARNING)
rank, world, out, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
for mode in ("host", "device", "light"):
    model, ddp, opt = ddp_mlp()
    state = {"step": 0}
    if rank == 1:
        model.fc1.register_forward_hook(lambda m, i, o: o * float("nan") if state["step"] == 1 else None)
    tracker = torchparity.NanInfTracker(model, **(dict(steps=[0], light="module") if mode == "light" else {}))
    tracker._host_read = mode != "device"
    gen = torch.Generator().manual_seed(100 + rank)
    with tracker:
        for s in range(3):
            state["step"] = s
            ddp(torch.randn(4, 8, generator=gen)).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
    with open(f"{out}/{mode}_rank{rank}.json", "w") as f:
        json.dump([f.to_dict() for f in tracker.findings], f)
dist.barrier()  # neither rank leaves while the other still talks to it (gloo aborts a rank otherwise)
dist.destroy_process_group()
