"""Write a synthetic multi-rank, multi-step statistics-mode job: ``OUT/dev`` and ``OUT/bench``.

    python bench/synth_job.py OUT --ranks 64 --records 50000 --steps 3 --plant-rank 37 --plant-step 2

Both sides are real dumps in today's format (``docs/dump-format.md``): ``torchparity.json``, and per
``stepS/rankR`` a ``header.json`` (with ``world_size``), ``modules.jsonl``, ``records.jsonl`` and a
clean ``footer.json``. ``--records`` is the number of records per rank over all steps (each step
holds ``records // steps``). A step is a decoder-style transformer step at the aten level: per layer
``input_layernorm``, ``q/k/v/o_proj`` mm, attention bmm/softmax, residual adds,
``post_attention_layernorm``, ``mlp.gate/up/down_proj`` mm, ``mlp.act_fn`` silu, mul; then the
backward of the same ops in reverse order (``fwd`` pointing at the forward record) and an optimizer
update per parameter. Activations are chained by ``producer``; parameters have no producer.

Every rank sees different data (its statistics differ), the two sides are the same except one planted
divergence on the device side: ``--plant-rank``/``--plant-step``, at the ``mlp.act_fn`` silu of the
middle layer, whose output statistics are scaled by ``1 + --factor``; every later activation of that
step (forward and backward) carries the same error, as a real divergence propagates. The bench side's
unplanted shards are hard links to the device side's files (identical content; halves the disk use),
falling back to a copy where links are not possible.

Prints the planted record's name and the bytes written. Uses orjson and a process pool (``-j``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import orjson

#: the forward ops of one layer: (module suffix, op, parameter shape or None, activation shape)
LAYER_OPS: list[tuple[str, str, list[int] | None]] = [
    ("input_layernorm", "aten.native_layer_norm.default", [1024]),
    ("self_attn.q_proj", "aten.mm.default", [1024, 1024]),
    ("self_attn.k_proj", "aten.mm.default", [1024, 1024]),
    ("self_attn.v_proj", "aten.mm.default", [1024, 1024]),
    ("self_attn", "aten.bmm.default", None),
    ("self_attn", "aten._softmax.default", None),
    ("self_attn", "aten.bmm.default", None),
    ("self_attn.o_proj", "aten.mm.default", [1024, 1024]),
    ("", "aten.add.Tensor", None),
    ("post_attention_layernorm", "aten.native_layer_norm.default", [1024]),
    ("mlp.gate_proj", "aten.mm.default", [2816, 1024]),
    ("mlp.up_proj", "aten.mm.default", [2816, 1024]),
    ("mlp.act_fn", "aten.silu.default", None),
    ("mlp", "aten.mul.Tensor", None),
    ("mlp.down_proj", "aten.mm.default", [1024, 2816]),
    ("", "aten.add.Tensor", None),
]
ACT_SHAPE = [8, 512, 1024]
MODULE_CLASS = {"input_layernorm": "LlamaRMSNorm", "post_attention_layernorm": "LlamaRMSNorm", "self_attn": "LlamaAttention",
                "mlp": "LlamaMLP", "mlp.act_fn": "SiLU", "": "LlamaDecoderLayer"}
PLANT_OP = "mlp.act_fn"


def _stride(shape: list[int]) -> list[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return out[::-1]


def step_plan(n: int) -> tuple[list[dict[str, Any]], int]:
    """The static part of one step's ``n`` records (names, ops, modules, data flow) and the index
    of the plantable record (the middle layer's ``mlp.act_fn`` silu)."""
    per_layer = len(LAYER_OPS)
    layers = max(1, n // (2 * per_layer + 2))
    fwd: list[tuple[str, str, list[int] | None]] = []
    for i in range(layers):
        for suffix, op, pshape in LAYER_OPS:
            fwd.append((f"model.layers.{i}" + (f".{suffix}" if suffix else ""), op, pshape))
    plan: list[dict[str, Any]] = []
    counters: dict[tuple[str, ...], int] = {}

    def add(module: str, op: str, pshape: list[int] | None, phase: str, fwd_id: int | None) -> None:
        base = op.split(".")[1]
        c = counters.get(("n", base, phase), 0)
        counters[("n", base, phase)] = c + 1
        ci = counters.get(("c", phase, module, op), 0)
        counters[("c", phase, module, op)] = ci + 1
        suffix = module.split(".", 3)[3] if module.count(".") >= 3 else ""
        plan.append({"id": len(plan), "name": f"Aten.{base}.{c}.{phase}", "op": op, "level": "aten", "phase": phase,
                     "module": module, "module_class": "Linear" if suffix.endswith("proj") else MODULE_CLASS[suffix],
                     "call_index": ci, "fwd": fwd_id, "stack": None, "_pshape": pshape})

    for module, op, pshape in fwd:
        if len(plan) >= n:
            break
        add(module, op, pshape, "forward", None)
    nf = len(plan)
    for j in range(nf - 1, -1, -1):
        if len(plan) >= n:
            break
        add(plan[j]["module"], plan[j]["op"], plan[j]["_pshape"], "backward", j)
    params = [p for p in plan[:nf] if p["_pshape"] is not None]
    k = 0
    while len(plan) < n:  # optimizer: one update per parameter (cycled when more records are asked for)
        p = params[k % len(params)] if params else plan[0]
        add(p["module"], "aten.add_.Tensor", p["_pshape"], "optimizer", None)
        k += 1
    mid = layers // 2
    target = f"model.layers.{mid}.{PLANT_OP}"
    plant = next((p["id"] for p in plan if p["module"] == target and p["phase"] == "forward"), nf // 2)
    return plan, plant


def _stats(v: float, scale: float) -> dict[str, Any]:
    v = v * scale
    return {"max": round(3.0 * v, 9), "min": round(-2.9 * v, 9), "mean": round(0.0021 * v, 12),
            "norm": round(181.0 * v, 9), "nan": 0, "inf": 0}


def shard_bytes(plan: list[dict[str, Any]], step: int, rank: int, plant_at: int | None, factor: float) -> bytes:
    """records.jsonl of one (step, rank): activation statistics from a per-(step, rank) random walk;
    from ``plant_at`` on (when given) every activation after the planted op's inputs is scaled."""
    import random

    rnd = random.Random(step * 1_000_003 + rank)
    pstats = {}
    act = 1.0 + 0.05 * rnd.random()
    scale = 1.0
    out = []
    astride = _stride(ACT_SHAPE)
    for p in plan:
        rid = p["id"]
        tensors = [{"io": "input", "arg": "0", "kind": "tensor", "dtype": "float32", "shape": ACT_SHAPE, "stride": astride,
                    "device": "cuda:0", "requires_grad": True, "stats": _stats(act, scale),
                    **({"producer": [rid - 1, 0]} if rid else {})}]
        ps = p["_pshape"]
        if ps is not None:
            key = (p["module"], p["op"])
            if key not in pstats:
                pstats[key] = {"max": round(0.05 + 0.001 * (len(pstats) % 7), 9), "min": -0.05, "mean": 1e-5,
                               "norm": round(18.0 + 0.01 * (len(pstats) % 13), 9), "nan": 0, "inf": 0}
            tensors.append({"io": "input", "arg": "1", "kind": "tensor", "dtype": "float32", "shape": ps,
                            "stride": _stride(ps), "device": "cuda:0", "requires_grad": True, "stats": pstats[key]})
        if plant_at is not None and rid == plant_at:
            scale *= factor
        act = act * (1.0 + 0.02 * (rnd.random() - 0.5))
        tensors.append({"io": "output", "arg": "0", "kind": "tensor", "dtype": "float32", "shape": ACT_SHAPE,
                        "stride": astride, "device": "cuda:0", "requires_grad": p["phase"] != "optimizer",
                        "stats": _stats(act, scale)})
        rec = {k: v for k, v in p.items() if k != "_pshape"}
        rec["step"], rec["rank"], rec["tensors"] = step, rank, tensors
        out.append(orjson.dumps(rec))
    return b"\n".join(out) + b"\n"


def _write_shard(args: tuple[str, str, int, int, int, int, int | None, float, str | None]) -> int:
    """Write one (step, rank) of the device side and link (or write) the bench side's."""
    out, side_dirs, step, rank, n, world, plant_at, factor, _ = args
    plan, _plant = step_plan(n)
    dev = Path(out) / "dev" / f"step{step}" / f"rank{rank}"
    ben = Path(out) / "bench" / f"step{step}" / f"rank{rank}"
    written = 0
    for d in (dev, ben):
        d.mkdir(parents=True, exist_ok=True)
    header = {"format": "torchparity-dump", "version": 1, "step": step, "rank": rank, "world_size": world,
              "level": "aten", "mode": "statistics", "checksum": None, "created": "2026-01-01T00:00:00+00:00",
              "backend": {"backend": "synthetic", "device_type": "cuda", "emulation": False, "torch_version": "2.13.0",
                          "numerics": {"deterministic_algorithms": False}}}
    modules = sorted({p["module"] for p in plan})
    mods = b"".join(orjson.dumps({"path": m, "class": None, "parent": m.rsplit(".", 1)[0] if "." in m else ""}) + b"\n"
                    for m in modules)
    data = shard_bytes(plan, step, rank, plant_at, factor)
    footer = {"complete": True, "records": len(plan), "tensor_bytes": 0, "budget_exhausted": False, "dropped_tensors": 0}
    files = {"header.json": json.dumps(header).encode(), "modules.jsonl": mods, "records.jsonl": data,
             "footer.json": json.dumps(footer).encode()}
    for name, b in files.items():
        (dev / name).write_bytes(b)
        written += len(b)
    clean = data if plant_at is None else shard_bytes(plan, step, rank, None, factor)
    for name, b in files.items():
        target = ben / name
        if target.exists():
            target.unlink()
        if name == "records.jsonl" and plant_at is not None:
            target.write_bytes(clean)
            written += len(clean)
            continue
        try:
            os.link(dev / name, target)
        except OSError:
            shutil.copyfile(dev / name, target)
            written += len(b)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output directory (OUT/dev and OUT/bench are written)")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--records", type=int, default=50_000, help="records per rank over all steps (default 50000)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--plant-rank", type=int, default=37)
    ap.add_argument("--plant-step", type=int, default=2)
    ap.add_argument("--factor", type=float, default=1.01, help="planted output scale (default 1.01: a 1%% error)")
    ap.add_argument("--no-plant", action="store_true", help="a clean job (no divergence)")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args(argv)
    if a.ranks < 1 or a.steps < 1 or a.records < a.steps * 4:
        print(f"synth_job: error: need --ranks >= 1, --steps >= 1 and --records >= 4 x steps", file=sys.stderr)
        return 2
    if not a.no_plant and not (0 <= a.plant_rank < a.ranks and 0 <= a.plant_step < a.steps):
        print(f"synth_job: error: --plant-rank must be < --ranks and --plant-step < --steps (or pass --no-plant)",
              file=sys.stderr)
        return 2
    n = a.records // a.steps
    plan, plant = step_plan(n)
    out = Path(a.out)
    t0 = time.perf_counter()
    for side in ("dev", "bench"):
        (out / side).mkdir(parents=True, exist_ok=True)
        (out / side / "torchparity.json").write_text(json.dumps(
            {"format": "torchparity-dump", "version": 1, "tool_version": "0.1.0", "created": "2026-01-01T00:00:00"}))
    jobs = [(str(out), "", s, r, n, a.ranks,
             plant if (not a.no_plant and s == a.plant_step and r == a.plant_rank) else None, a.factor, None)
            for s in range(a.steps) for r in range(a.ranks)]
    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs) as ex:
            written = sum(ex.map(_write_shard, jobs, chunksize=4))
    else:
        written = sum(map(_write_shard, jobs))
    dt = time.perf_counter() - t0
    p = plan[plant]
    where = "none (clean job)" if a.no_plant else \
        f"step {a.plant_step} rank {a.plant_rank} {p['name']} [{p['op']}] in {p['module']}, op #{plant}"
    print(f"wrote {a.ranks} ranks x {a.steps} steps x {n} records per side to {out}/dev and {out}/bench "
          f"({written / 1e6:.0f} MB on disk, bench shards hard-linked; {dt:.1f} s); planted: {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
