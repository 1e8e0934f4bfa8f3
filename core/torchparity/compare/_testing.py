"""Synthetic dumps for tests and benchmarks (no capture engine needed).

:class:`SyntheticDump` writes records in the documented layout (``docs/dump-format.md``) with
:class:`~torchparity.records.OpRecord` / :class:`~torchparity.records.TensorEntry`;
:func:`mlp_stack_dump` runs a small residual MLP stack through it, with an optional planted fault,
an optional extra op and an optional low-precision device dtype; :func:`bulk_stats_dump` writes
many statistics records fast (for the 100k-record timing test). :func:`gloo_job` runs a test's
multi-process gloo job (one script per rank), whose ranks build their DDP model with :func:`ddp_mlp`.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Callable, Sequence

from ..records import FORMAT_NAME, FORMAT_VERSION, OpRecord, TensorEntry


def _dtype_name(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


class SyntheticDump:
    """Writes one (step, rank) directory of a dump from tensors computed in Python."""

    def __init__(self, root: str | Path, mode: str = "statistics", step: int = 0, rank: int = 0,
                 level: str = "aten", footer: bool = True) -> None:
        self.root = Path(root)
        self.mode = mode
        self.step, self.rank, self.level = step, rank, level
        self.dir = self.root / f"step{step}" / f"rank{rank}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.records: list[OpRecord] = []
        self.tensors: dict[str, Any] = {}
        self.counters: dict[tuple[str, ...], int] = {}
        self.write_footer = footer

    def _count(self, key: tuple[str, ...]) -> int:
        n = self.counters.get(key, 0)
        self.counters[key] = n + 1
        return n

    def entry(self, io: str, arg: str, t: Any, producer: list[int] | None, rid: int) -> TensorEntry:
        import torch

        if not isinstance(t, torch.Tensor):
            return TensorEntry(io=io, arg=arg, kind="scalar", value=t)
        td = t.detach()
        f = td.double()
        stats = {
            "max": float(f.max()) if td.numel() else None, "min": float(f.min()) if td.numel() else None,
            "mean": float(f.mean()) if td.numel() else None, "norm": float(f.norm()) if td.numel() else None,
            "nan": int(torch.isnan(td).sum()), "inf": int(torch.isinf(td).sum()),
        }
        e = TensorEntry(io=io, arg=arg, dtype=_dtype_name(td), shape=list(td.shape), stride=list(td.stride()),
                        device="cpu", requires_grad=bool(t.requires_grad), stats=stats, producer=producer)
        if self.mode == "md5":
            e.md5 = hashlib.md5(td.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest() \
                if td.numel() else hashlib.md5(b"").hexdigest()
        if self.mode == "tensor":
            key = f"{rid}.{io}.{arg}"
            self.tensors[key] = td.contiguous().clone()
            e.file, e.key = "tensors/000000.safetensors", key
        return e

    def op(self, op: str, module: str, inputs: Sequence[tuple[Any, Any]], outputs: Sequence[Any],
           phase: str = "forward", base: str | None = None, prefix: str = "Aten",
           params: Sequence[tuple[str, Any]] = ()) -> list[tuple[int, int]]:
        """Record one op call; ``inputs`` are (value, producer-or-None). Returns output refs."""
        rid = len(self.records)
        base = base or op.split(".")[1] if op.startswith("aten.") else (base or op)
        counter = self._count(("name", base, phase))
        call_index = self._count(("ci", phase, module, op))
        # an API-style record (Functional.linear ...) is written at the api level, as the capture does
        level = "api" if self.level == "aten" and prefix not in ("Aten", "Distributed") else self.level
        rec = OpRecord(id=rid, name=f"{prefix}.{base}.{counter}.{phase}", op=op, level=level, phase=phase,
                       module=module, module_class=None, call_index=call_index, step=self.step, rank=self.rank)
        for i, (v, prod) in enumerate(inputs):
            rec.tensors.append(self.entry("input", str(i), v, list(prod) if prod else None, rid))
        for name, v in params:
            rec.tensors.append(self.entry("param", name, v, None, rid))
        for i, v in enumerate(outputs):
            rec.tensors.append(self.entry("output", str(i), v, None, rid))
        self.records.append(rec)
        return [(rid, i) for i in range(len(outputs))]

    def close(self, header_extra: dict[str, Any] | None = None) -> Path:
        (self.root / "torchparity.json").write_text(json.dumps(
            {"format": FORMAT_NAME, "version": FORMAT_VERSION, "tool_version": "0.1.0", "created": "2026-01-01T00:00:00"}))
        header = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "step": self.step, "rank": self.rank,
                  "world_size": 1, "level": self.level, "mode": self.mode,
                  "backend": {"backend": "cpu", "device_type": "cpu", "emulation": False, "torch_version": "2.13.0+cpu",
                              "numerics": {"deterministic_algorithms": False}}}
        header.update(header_extra or {})
        (self.dir / "header.json").write_text(json.dumps(header))
        if self.tensors:
            from safetensors.torch import save_file

            (self.dir / "tensors").mkdir(exist_ok=True)
            save_file(self.tensors, str(self.dir / "tensors" / "000000.safetensors"))
        with open(self.dir / "records.jsonl", "w", encoding="utf-8") as f:
            for r in self.records:
                f.write(json.dumps(r.to_json()) + "\n")
        if self.write_footer:
            (self.dir / "footer.json").write_text(json.dumps({"complete": True, "records": len(self.records),
                                                               "tensor_bytes": 0, "budget_exhausted": False,
                                                               "dropped_tensors": 0}))
        return self.root


def mlp_stack_dump(root: str | Path, mode: str = "statistics", *, layers: int = 3, width: int = 64,
                   batch: int = 16, dtype: Any = None, fault: tuple[str, Any] | None = None,
                   extra_op: str | None = None, seed: int = 0, step: int = 0, rank: int = 0,
                   footer: bool = True, param_fault: str | None = None, casts: int = 0) -> Path:
    """A residual MLP stack, recorded at the aten level with data flow.

    Per layer ``i`` (module ``layers.i``): ``fc1`` (mm, add bias) -> ``act`` (gelu) -> ``fc2``
    (mm) -> residual add -> ``norm`` (layer_norm). ``dtype`` (e.g. torch.bfloat16) makes the whole
    computation run in that dtype (the "device" side). ``fault=("layers.1.act", factor)`` multiplies
    the gelu output of that module by ``factor`` (a number, or ``"nan"``). ``extra_op`` names a
    module in which an extra ``aten.clone`` (identity) runs first. ``param_fault`` names a module
    whose fc1 weight is perturbed by 1 %. ``casts`` records that many ``aten._to_copy`` (the dtype given as
    a scalar argument, as a bf16 run casts around its float32 islands) at the start of every
    layer: records with a scalar argument (no shape) whose call counts differ between two dumps
    made with different ``casts``.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    dt = dtype or torch.float32
    d = SyntheticDump(root, mode, step=step, rank=rank, footer=footer)
    x = torch.randn(batch, width, generator=g)
    ws = [(torch.randn(width, width, generator=g) / math.sqrt(width), torch.randn(width, generator=g) * 0.1,
           torch.randn(width, width, generator=g) / math.sqrt(width)) for _ in range(layers)]
    h, hp = x.to(dt), None
    for i, (w1, b1, w2) in enumerate(ws):
        m = f"layers.{i}"
        w1, b1, w2 = w1.to(dt), b1.to(dt), w2.to(dt)
        if param_fault == m:
            w1 = w1 * 1.01
        for _ in range(casts):
            h2 = h.float().to(dt)
            hp = d.op("aten._to_copy.default", m, [(h, hp), (str(dt), None)], [h2])[0]
            h = h2
        if extra_op == m:
            h2 = h.clone()
            hp = d.op("aten.clone.default", m, [(h, hp)], [h2])[0]
            h = h2
        y = h @ w1
        yp = d.op("aten.mm.default", f"{m}.fc1", [(h, hp), (w1, None)], [y])[0]
        y2 = y + b1
        y2p = d.op("aten.add.Tensor", f"{m}.fc1", [(y, yp), (b1, None)], [y2])[0]
        a = torch.nn.functional.gelu(y2)
        if fault and fault[0] == f"{m}.act":
            a = a * float("nan") if fault[1] == "nan" else a * fault[1]
        ap = d.op("aten.gelu.default", f"{m}.act", [(y2, y2p)], [a])[0]
        z = a @ w2
        zp = d.op("aten.mm.default", f"{m}.fc2", [(a, ap), (w2, None)], [z])[0]
        r = h + z
        rp = d.op("aten.add.Tensor", m, [(h, hp), (z, zp)], [r])[0]
        n = torch.nn.functional.layer_norm(r, (width,))
        hp = d.op("aten.native_layer_norm.default", f"{m}.norm", [(r, rp)], [n])[0]
        h = n
    loss = h.float().pow(2).mean()
    d.op("aten.mean.default", "", [(h, hp)], [loss])
    return d.close()


def bulk_stats_dump(root: str | Path, n_records: int, *, seed: int = 0, fault_at: int | None = None,
                    factor: float = 1.5) -> Path:
    """``n_records`` statistics records (one input, one output each, chained by producer).

    Written with plain dict -> JSON (fast). ``fault_at`` scales that record's output stats (and all
    later ones, as propagation would) by ``factor``.
    """
    import random

    rnd = random.Random(seed)
    root = Path(root)
    d = root / "step0" / "rank0"
    d.mkdir(parents=True, exist_ok=True)
    (root / "torchparity.json").write_text(json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION}))
    (d / "header.json").write_text(json.dumps({"format": FORMAT_NAME, "version": 1, "step": 0, "rank": 0,
                                               "mode": "statistics", "level": "aten"}))
    ops = ["aten.mm.default", "aten.add.Tensor", "aten.gelu.default", "aten.mul.Tensor"]
    counters: dict[Any, int] = {}
    norm = 10.0
    lines = []
    scale = 1.0
    for i in range(n_records):
        op = ops[i % 4]
        module = f"layers.{i // 40}.sub{(i // 4) % 10}"
        k = (op, module)
        ci = counters.get(k, 0)
        counters[k] = ci + 1
        nk = (op,)
        cnt = counters.get(nk, 0)
        counters[nk] = cnt + 1
        in_stats = {"max": 3.0 * scale, "min": -3.0 * scale, "mean": 0.01 * scale, "norm": norm * scale, "nan": 0, "inf": 0}
        if fault_at is not None and i == fault_at:
            scale *= factor
        norm_out = 10.0 * (1 + 0.1 * rnd.random())  # chained: the next record's input
        out_stats = {"max": 3.0 * scale, "min": -3.0 * scale, "mean": 0.01 * scale, "norm": norm * scale, "nan": 0, "inf": 0}
        norm = norm_out
        in_stats["norm"] = in_stats["norm"]
        rec = {"id": i, "name": f"Aten.{op.split('.')[1]}.{cnt}.forward", "op": op, "level": "aten", "phase": "forward",
               "module": module, "module_class": "Linear", "call_index": ci, "step": 0, "rank": 0, "fwd": None,
               "stack": None, "tensors": [
                   {"io": "input", "arg": "0", "kind": "tensor", "dtype": "float32", "shape": [16, 64],
                    "stride": [64, 1], "device": "cpu", "requires_grad": True, "stats": in_stats,
                    **({"producer": [i - 1, 0]} if i else {})},
                   {"io": "output", "arg": "0", "kind": "tensor", "dtype": "float32", "shape": [16, 64],
                    "stride": [64, 1], "device": "cpu", "requires_grad": True, "stats": out_stats}]}
        lines.append(json.dumps(rec))
    (d / "records.jsonl").write_text("\n".join(lines) + "\n")
    (d / "footer.json").write_text(json.dumps({"complete": True, "records": n_records}))
    return root


def run_cli(args: Sequence[str]) -> tuple[int, str]:
    """Run the torchparity CLI in-process; return (exit code, combined output)."""
    import contextlib
    import io

    from ..cli import main

    buf = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, buf.getvalue()


Fault = Callable[..., Any]


#: gloo's TCP transport sometimes loses a connection between two processes of one job on a loaded
#: machine (upstream flakiness: pytorch/pytorch#53270, #57469): the ranks then end with this message
#: and say nothing about torchparity. Such a run is started once more, in a fresh folder.
GLOO_TRANSPORT_FLAKE = "gloo/transport/tcp/pair.cc"


def run_ranks(script: Any, world: int, work: Any, args_of: Callable[[int, Any], list[str]] | None = None,
              timeout: float = 180.0, env: dict[str, str] | None = None) -> tuple[list[int], list[str]]:
    """Run ``script`` once per rank, as a gloo job's processes; returns (exit codes, stderrs).
    ``args_of(rank, work)`` gives each process's arguments (default ``RANK WORLD WORK WORK/init``:
    the job's results under ``WORK``, rendezvous through the file ``WORK/init``); ``env``: the
    processes' environment (default this one's)."""
    import subprocess
    import sys

    if args_of is None:
        def args_of(r: int, w: Any) -> list[str]:
            return [str(r), str(world), str(w), str(Path(w) / "init")]
    procs = [subprocess.Popen([sys.executable, str(script), *args_of(r, work)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    errs = [p.communicate(timeout=timeout)[1] for p in procs]
    return [p.returncode for p in procs], errs


def gloo_job(script: Any, world: int, new_dir: Callable[[str], Any],
             args_of: Callable[[int, Any], list[str]] | None = None,
             ok: Callable[[list[int], list[str]], bool] | None = None,
             attempts: int = 2, env: dict[str, str] | None = None) -> tuple[list[int], list[str], Any]:
    """:func:`run_ranks` in a fresh folder (``new_dir(name)`` makes it), once more in another when
    ``ok(codes, errs)`` (default: every rank exited 0) rejects the run and a rank failed on gloo's
    own transport error; returns (exit codes, stderrs, the folder)."""
    for attempt in range(attempts):
        work = new_dir(f"attempt{attempt}")
        codes, errs = run_ranks(script, world, work, args_of, env=env)
        good = ok(codes, errs) if ok is not None else codes == [0] * world
        if good or not any(GLOO_TRANSPORT_FLAKE in e for e in errs):
            break
    return codes, errs, work


def ddp_mlp(lr: float = 0.5) -> tuple[Any, Any, Any]:
    """The model of the tests' gloo DDP jobs (inside a rank of :func:`gloo_job`, after
    ``init_process_group``): ``fc1`` (Linear 8->16), ``act`` (Tanh), ``fc2`` (Linear 16->4), made
    from seed 0 on every rank, wrapped in DDP, with SGD at ``lr``. Returns (model, ddp, optimizer)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("fc1", torch.nn.Linear(8, 16))
    model.add_module("act", torch.nn.Tanh())
    model.add_module("fc2", torch.nn.Linear(16, 4))
    ddp = DistributedDataParallel(model)
    return model, ddp, torch.optim.SGD(ddp.parameters(), lr=lr)

