"""One rank of the 4-rank gloo DDP job the replica tests share (run as a script, one process per rank).

Three phases, each 3 optimizer steps of a small DDP model, each with ``ReplicaCheck`` online and
``torchparity.dump(..., replica_check=True)`` (module level, statistics) into ``OUT/<phase>``:

* ``clean``: nothing planted;
* ``grad``: at step 1, rank 2 scales its fc1.weight gradient by 1+1e-6 after the all-reduce;
* ``param``: at step 1, rank 3's optimizer update of fc2.bias is off by one ulp (an optimizer
  post-hook that runs before the check's), its gradients stay equal.

Each rank writes ``OUT/<phase>/online_rank{R}.json``: the online check's findings and gathers.
"""

import json
import sys

import torch
import torch.distributed as dist

import torchparity
from torchparity.compare._testing import ddp_mlp

rank, world, out, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)


def run(phase: str) -> None:
    model, ddp, opt = ddp_mlp()
    step = {"n": 0}
    if phase == "param" and rank == 3:
        def perturb(optimizer, args, kwargs):
            if step["n"] == 1:
                with torch.no_grad():
                    b = model.fc2.bias
                    b[0] = torch.nextafter(b[0], b[0] + 1)
        opt.register_step_post_hook(perturb)  # before the check's hooks: runs first
    check = torchparity.ReplicaCheck(ddp, opt)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data, as in data parallel
    with torchparity.dump(f"{out}/{phase}", level="module", mode="statistics", replica_check=True, model=model), check:
        for s in range(3):
            step["n"] = s
            x = torch.randn(4, 8, generator=gen)
            ddp(x).pow(2).sum().backward()
            if phase == "grad" and rank == 2 and s == 1:
                with torch.no_grad():
                    model.fc1.weight.grad.mul_(1 + 1e-6)
            opt.step()
            opt.zero_grad()
    with open(f"{out}/{phase}/online_rank{rank}.json", "w") as f:
        json.dump({"findings": [x.to_json() for x in check.findings], "gathers": check.gathers,
                   "steps": check.steps_checked}, f)


for phase in ("clean", "grad", "param"):
    run(phase)
dist.barrier()
dist.destroy_process_group()
