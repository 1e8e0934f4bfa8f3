"""One rank of a small distributed training job (gloo, CPU), optionally dumped by torchparity.

Run by tests/dump/test_distributed_dump.py (and usable by hand / under torchrun)::

    python dist_job.py KIND RANK WORLD INIT RESULT [DUMP_DIR LEVEL [FAULT_RANK]]

``KIND`` is ``ddp``, ``fsdp2``, ``mesh`` (a 2x2 DeviceMesh: data parallel x tensor parallel, a
row-parallel linear that all-reduces over the TP group) or ``p2p`` (two pipeline stages talking
with ``send``/``recv`` and ``batch_isend_irecv``). ``RANK``/``WORLD`` of ``-1`` read torchrun's
environment. ``INIT`` is a rendezvous file (``env`` under torchrun). ``RESULT`` receives the
losses and the parameters' bytes (hex) as JSON, to compare tool on with tool off bitwise.
``DUMP_DIR`` of ``-`` (or absent) runs without the tool. ``FAULT_RANK`` scales that rank's input by
``1 + 1e-3`` (a planted divergence for the compare tests).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

import torch
import torch.distributed as dist

STEPS = 2


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _batch(step: int, rank: int, fault: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(4, 8, generator=g)
    return x * (1 + 1e-3) if fault else x


def _train(model: torch.nn.Module, rank: int, fault: bool) -> list[float]:
    """STEPS steps of SGD on the rank's batches; the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        loss = model(_batch(step, rank, fault)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _ddp(rank: int, fault: bool) -> tuple[list[float], list[torch.Tensor]]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_model())
    return _train(model, rank, fault), [p.detach() for p in model.parameters()]


def _fsdp2(rank: int, fault: bool) -> tuple[list[float], list[torch.Tensor]]:
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard

    model = _model()
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    return _train(model, rank, fault), [p.full_tensor().detach() for p in model.parameters()]


class _RowParallel(torch.nn.Module):
    """y = x @ W.T with W's input columns split over the TP group: a partial product per rank,
    summed by an all-reduce over that group (Megatron's RowParallelLinear, by hand)."""

    def __init__(self, full: torch.nn.Linear, tp_rank: int, tp_size: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        cols = full.in_features // tp_size
        self.weight = torch.nn.Parameter(full.weight.detach()[:, tp_rank * cols:(tp_rank + 1) * cols].clone())
        self.bias = torch.nn.Parameter(full.bias.detach().clone())
        self.cols, self.tp_rank, self.group = cols, tp_rank, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        part = x[:, self.tp_rank * self.cols:(self.tp_rank + 1) * self.cols] @ self.weight.t()
        part = _AllReduce.apply(part, self.group)
        return part + self.bias


class _AllReduce(torch.autograd.Function):
    """Sum over a group forward; identity backward (each rank's partial product's gradient is the
    full output's gradient)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:  # type: ignore[override]
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return g, None


def _mesh(rank: int, fault: bool) -> tuple[list[float], list[torch.Tensor]]:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh["dp"].get_group(), mesh["tp"].get_group()
    full = _model()
    model = torch.nn.Sequential(full[0], full[1], _RowParallel(full[2], mesh["tp"].get_local_rank(), 2, tp))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dp_rank = mesh["dp"].get_local_rank()
    losses = []
    for step in range(STEPS):
        loss = model(_batch(step, dp_rank, fault)).square().mean()
        loss.backward()
        for p in model.parameters():  # data parallel: average the gradients over the DP group
            dist.all_reduce(p.grad, group=dp)
            p.grad /= 2
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.detach() for p in model.parameters()]


def _p2p(rank: int, fault: bool) -> tuple[list[float], list[torch.Tensor]]:
    full = _model()
    stage = full[0:2] if rank == 0 else full[2:]
    opt = torch.optim.SGD(stage.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        if rank == 0:
            act = stage(_batch(step, 0, fault))
            dist.send(act.detach(), dst=1)  # the activation, forward
            grad = torch.empty_like(act)
            dist.recv(grad, src=1)  # its gradient, backward
            act.backward(grad)
            loss = torch.zeros(())
            # the loss comes back by a batched exchange (batch_isend_irecv)
            for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, loss, 1)]):
                w.wait()
        else:
            act = torch.empty(4, 16)
            dist.recv(act, src=0)
            act.requires_grad_(True)
            loss = stage(act).square().mean()
            loss.backward()
            dist.send(act.grad, dst=0)
            for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, loss.detach(), 0)]):
                w.wait()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.detach() for p in stage.parameters()]


JOBS = {"ddp": _ddp, "fsdp2": _fsdp2, "mesh": _mesh, "p2p": _p2p}


def main(argv: list[str]) -> None:
    kind, rank, world, init, result = argv[:5]
    out = argv[5] if len(argv) > 5 else "-"
    level = argv[6] if len(argv) > 6 else "aten"
    fault_rank = int(argv[7]) if len(argv) > 7 else -1
    rank_i, world_i = int(rank), int(world)
    if init == "env":
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", init_method="file://" + init, rank=rank_i, world_size=world_i)
    rank_i = dist.get_rank()
    import torchparity

    ctx = torchparity.dump(out, level=level) if out != "-" else contextlib.nullcontext()
    with ctx:
        losses, params = JOBS[kind](rank_i, rank_i == fault_rank)
    dist.barrier()  # neither rank leaves while another still talks to it
    res = {"rank": rank_i, "losses": [float(x).hex() for x in losses],
           "params": [p.contiguous().numpy().tobytes().hex() for p in params]}
    path = result.replace("{rank}", str(rank_i))
    with open(path + ".tmp", "w") as fh:
        json.dump(res, fh)
    os.replace(path + ".tmp", path)
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # gloo's threads sometimes abort the interpreter's teardown ("terminate called ...")


if __name__ == "__main__":
    main(sys.argv[1:])
