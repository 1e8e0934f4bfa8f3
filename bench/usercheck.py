"""The new-user check on models we did not write: ``python bench/usercheck.py``.

Hugging Face Llama (``attn_implementation="eager"``), BERT (padding mask) and a CNN with BatchNorm
and Dropout (the zoo's models, tests/zoo/zoo_models.py: random init from config classes, no
download), in float32, bf16 and fp16 autocast + GradScaler, AdamW. For each:

* ``watch``: 6 steps under ``torchparity.watch(every=2)`` vs without: losses, parameters and
  optimizer state bitwise equal; no trigger on a clean run;
* ``compile``: the model ``torch.compile``d (Inductor on the CPU, one thread, ``fallback_random``)
  trained 2 steps without the tool and inside ``torchparity.dump(level="aten")``: bitwise equal;
  then ``torchparity.compare`` of an eager aten dump against the compiled dump: verdict counts and
  the root cause (expected: none);
* ``compiled-fn``: the model's forward and loss as a ``torch.compile``d *function* (not a
  compiled module) and ``torch.compile(opt.step)``, trained 2 steps without the tool and under
  ``torchparity.dump(level="aten")`` and the NaN/Inf tracker together: bitwise equal (they ran
  eagerly under the tools before session 19), no NaN/Inf finding, and the dump's step header
  says what compiled functions leave unrecorded;
* ``compile-fault``: a x1.05 forward hook on the model's planted-fault module in the compiled run
  (traced into the graph, fused by Inductor), one step; compared with the eager run (both ways)
  and with a clean compiled run: the root cause must be in step 0 and in that module's block (the
  module of the first value the graph stores after the fault);
* ``compile-blocks``: the model's layers compiled one by one, as ``compile``, and a fault planted in
  one block named in that block;
* ``compile-accum``: the compiled model trained 2 steps of 2 micro-batches each (gradient
  accumulation) and then evaluated under ``no_grad`` in eval mode, without and inside the aten
  dump (bitwise equal), compared with the same loop eager, both ways: no divergence.

Prints one line per (model, precision, feature) and a Markdown table (``--out``). Exit 1 when a
check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
import zoo_models as zm  # noqa: E402

import torchparity  # noqa: E402

MODELS = ("llama-eager", "bert", "cnn")


def _state(t: zm.Trainer) -> list[torch.Tensor]:
    out = [p.detach().clone() for p in t.model.parameters()]
    for st in t.opt.state.values():
        out += [v.clone() for v in st.values() if isinstance(v, torch.Tensor)]
    return out


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape and
                                    torch.equal(x.reshape(-1).view(torch.uint8) if x.is_floating_point() else x,
                                                y.reshape(-1).view(torch.uint8) if y.is_floating_point() else y)
                                    for x, y in zip(a, b))


def check_watch(name: str, prec: str, root: Path) -> tuple[bool, str]:
    spec = zm.ZOO[name]
    off = zm.Trainer(spec, prec)
    l0 = off.train(6)
    on = zm.Trainer(spec, prec)
    with torchparity.watch(on.model, on.opt, output_dir=root / "watch", every=2, scaler=on.scaler) as w:
        l1 = [w.run(lambda _b: on.step(), None) for _ in range(6)]
    ok = l0 == l1 and _same(_state(off), _state(on)) and not w.triggers
    return ok, f"losses equal {l0 == l1}, state bitwise {_same(_state(off), _state(on))}, triggers {len(w.triggers)}"


def _compiled(spec: zm.ZooSpec, prec: str) -> zm.Trainer:
    t = zm.Trainer(spec, prec)
    t.model = torch.compile(t.model)
    return t


def _off_and_on(make: Any, tools: Any) -> tuple[bool, Any]:
    """Two trainers from ``make()`` trained 2 steps, the second inside the context ``tools(trainer)``
    returns (fresh Dynamo caches for each): (bitwise equal, what the context gave)."""
    torch._dynamo.reset()
    off = make()
    l0 = off.train(2)
    torch._dynamo.reset()
    on = make()
    with tools(on) as got:
        l1 = on.train(2)
    return l0 == l1 and _same(_state(off), _state(on)), got


def _compiled_against_eager(spec: zm.ZooSpec, prec: str, root: Path, make: Any) -> tuple[bool, Any, zm.Trainer]:
    """A compiled trainer from ``make()`` trained 2 steps without and inside the aten dump
    (``root/compiled``), the eager model dumped alike (``root/eager``) and compared with it:
    (tool on == off bitwise, the compare's result, the eager trainer)."""
    bitwise, _ = _off_and_on(make, lambda on: torchparity.dump(str(root / "compiled"), model=on.model, level="aten"))
    eager = zm.Trainer(spec, prec)
    with torchparity.dump(str(root / "eager"), model=eager.model, level="aten"):
        eager.train(2)
    return bitwise, torchparity.compare(str(root / "eager"), str(root / "compiled"), output_dir=str(root / "out")), eager


def check_compile(name: str, prec: str, root: Path) -> tuple[bool, str]:
    spec = zm.ZOO[name]
    bitwise, res, _ = _compiled_against_eager(spec, prec, root, lambda: _compiled(spec, prec))
    s = res.summary
    rc = res.root_cause
    ok = bitwise and rc is None and not s.get("n_error")
    return ok, (f"tool on == off bitwise {bitwise}; compare: {s.get('n_pass')} pass, {s.get('n_warning')} warning, "
                f"{s.get('n_error')} error, root cause {rc.name if rc is not None else 'none'}")


def _compiled_functions(spec: zm.ZooSpec, prec: str) -> zm.Trainer:
    """A trainer whose forward + loss and optimizer step are compiled functions."""
    import types

    t = zm.Trainer(spec, prec)
    t.spec = types.SimpleNamespace(loss=torch.compile(spec.loss))  # Trainer.step calls spec.loss
    t.opt.step = torch.compile(t.opt.step)  # GradScaler.step calls it too
    return t


def check_compiled_fn(name: str, prec: str, root: Path) -> tuple[bool, str]:
    import json

    spec = zm.ZOO[name]

    @contextlib.contextmanager
    def dump_and_tracker(on: zm.Trainer) -> Any:
        with torchparity.dump(str(root / "dump"), model=on.model, level="aten"), \
                torchparity.NanInfTracker(on.model) as tracker:
            yield tracker

    bitwise, tracker = _off_and_on(lambda: _compiled_functions(spec, prec), dump_and_tracker)
    header = json.loads((root / "dump" / "step1" / "rank0" / "header.json").read_text())
    said = "compiled_functions" in header
    ok = bitwise and not tracker.findings and said
    return ok, (f"tool on == off bitwise {bitwise}; NaN/Inf findings {len(tracker.findings)}; "
                f"header says what is not recorded {said}")


#: where compile-fault plants, when not the spec's fwd_module: the CNN's head output is the graph's
#: output, so a hook there adds a node only the faulty run has (a device fault changes a node both
#: runs have; compare does not blame an op one compiled run alone recorded). With the modules the
#: root cause may name: the planted one and those whose first stored value comes after it.
PLANT = {"cnn": ("act2", ("act2", "drop", "head", ""))}


def _block(module: str) -> str:
    """The block a planted module sits in (``model.layers.1.mlp.down_proj`` -> ``model.layers.1``):
    where the first value a compiled graph stores after a fused fault may belong."""
    parts = module.split(".")
    return ".".join(parts[:-2]) if len(parts) > 2 else ""


def check_compile_fault(name: str, prec: str, root: Path) -> tuple[bool, str]:
    """A x1.05 forward hook on the spec's ``fwd_module`` of the compiled run (traced into the
    graph, fused by Inductor): compared with the eager run and with a clean compiled run, the root
    cause is in step 0 and in that module's block."""
    spec = zm.ZOO[name]
    planted, where = PLANT.get(name, (spec.fwd_module, None))
    runs = {}
    for tag, fault in (("clean", False), ("fault", True)):
        torch._dynamo.reset()
        t = zm.Trainer(spec, prec)
        if fault:
            dict(t.model.named_modules())[planted].register_forward_hook(lambda m, i, o: o * 1.05)
        t.model = torch.compile(t.model)
        with torchparity.dump(str(root / tag), model=t.model, level="aten"):
            t.train(1)
        runs[tag] = root / tag
    eager = zm.Trainer(spec, prec)
    with torchparity.dump(str(root / "eager"), model=eager.model, level="aten"):
        eager.train(1)
    block, notes, ok = _block(planted), [], True
    for a, b in (("eager", "fault"), ("fault", "eager"), ("fault", "clean")):
        rc = torchparity.compare(str(root / a), str(root / b)).root_cause
        hit = rc is not None and rc.step == 0 and (rc.module in where if where is not None else
                                                   rc.module == block or rc.module.startswith(block + "."))
        ok &= hit
        notes.append(f"{a} vs {b}: {f'{rc.name} in {rc.module} ({rc.phase})' if rc is not None else 'no root cause'}")
    return ok, f"planted in {planted}; " + "; ".join(notes)


def block_paths(model: torch.nn.Module) -> list[str]:
    """The blocks a large job would compile one by one: the layers of the model's largest
    ``ModuleList``, else each direct child that holds parameters."""
    lists = [(len(m), p) for p, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if lists:
        _, path = max(lists)
        return [f"{path}.{i}" for i in range(len(model.get_submodule(path)))]
    return [n for n, c in model.named_children() if any(True for _ in c.parameters())]


def _compiled_blocks(spec: zm.ZooSpec, prec: str, fault: str | None = None) -> zm.Trainer:
    t = zm.Trainer(spec, prec)
    if fault is not None:
        t.model.get_submodule(fault).register_forward_hook(lambda m, i, o: o * 1.05)
    for path in block_paths(t.model):
        parent, _, name = path.rpartition(".")
        owner = t.model.get_submodule(parent) if parent else t.model
        setattr(owner, name, torch.compile(owner.get_submodule(name)))
    return t


#: compile-blocks plants in a compiled block: the CNN's planted-fault module (act2) holds no parameters,
#: so it is no block; its BatchNorm is
BLOCK_PLANT = {"cnn": "bn2"}


def _block_plant(name: str, model: torch.nn.Module) -> tuple[str, str]:
    """(module to plant the fault in, its compiled block) for compile-blocks: the spec's module, moved
    into the FIRST block. Blocks of one class share one compiled graph, and Dynamo does not see a hook
    added to a later block's submodule (torch's own compiled run ignores it: checked on BERT, 2.13)."""
    planted = BLOCK_PLANT.get(name, zm.ZOO[name].fwd_module)
    blocks = block_paths(model)
    for b in blocks:
        if planted == b:  # a block itself (the CNN's BatchNorm)
            return planted, b
        if planted.startswith(b + "."):
            return blocks[0] + planted[len(b):], blocks[0]
    return planted, planted


def check_compile_blocks(name: str, prec: str, root: Path) -> tuple[bool, str]:
    spec = zm.ZOO[name]
    bitwise, res, eager = _compiled_against_eager(spec, prec, root, lambda: _compiled_blocks(spec, prec))
    s, rc = res.summary, res.root_cause
    planted, block = _block_plant(name, eager.model)
    torch._dynamo.reset()
    faulty = _compiled_blocks(spec, prec, fault=planted)
    with torchparity.dump(str(root / "fault"), model=faulty.model, level="aten"):
        faulty.train(1)
    frc = torchparity.compare(str(root / "eager"), str(root / "fault")).root_cause
    hit = frc is not None and frc.step == 0 and (frc.module == block or frc.module.startswith(block + "."))
    ok = bitwise and rc is None and not s.get("n_error") and hit
    return ok, (f"blocks {len(block_paths(eager.model))}; tool on == off bitwise {bitwise}; compare: {s.get('n_pass')} "
                f"pass, {s.get('n_warning')} warning, {s.get('n_error')} error, root cause "
                f"{rc.name if rc is not None else 'none'}; planted in {planted}: "
                f"{f'{frc.name} in {frc.module} ({frc.phase})' if frc is not None else 'no root cause'}")


def _accumulate_and_evaluate(t: zm.Trainer) -> list[float]:
    """Two optimizer steps of two micro-batches each (the batch's halves, gradients accumulated),
    then the whole batch evaluated under ``no_grad`` in eval mode: the losses."""
    halves = [{k: v[:1] for k, v in t.batch.items()}, {k: v[1:] for k, v in t.batch.items()}]
    losses = []
    for step in range(2):
        torch.manual_seed(1000 + step)
        for half in halves:
            with t._autocast():
                loss = t.spec.loss(t.model, half) / len(halves)
            (t.scaler.scale(loss) if t.scaler is not None else loss).backward()
            losses.append(float(loss.detach()))
        if t.scaler is not None:
            t.scaler.step(t.opt)
            t.scaler.update()
        else:
            t.opt.step()
        t.opt.zero_grad(set_to_none=True)
    t.model.eval()
    with torch.no_grad(), t._autocast():
        losses.append(float(t.spec.loss(t.model, t.batch).detach()))
    t.model.train()
    return losses


def check_compile_accum(name: str, prec: str, root: Path) -> tuple[bool, str]:
    """The compiled model with gradient accumulation and an evaluation under no_grad: tool on ==
    off bitwise, and compared with the same loop eager, both ways, no divergence."""
    spec = zm.ZOO[name]
    runs = []
    for out in (None, root / "compiled"):
        torch._dynamo.reset()
        t = _compiled(spec, prec)
        with (torchparity.dump(str(out), model=t.model, level="aten") if out else contextlib.nullcontext()):
            losses = _accumulate_and_evaluate(t)
        runs.append((losses, _state(t)))
    bitwise = runs[0][0] == runs[1][0] and _same(runs[0][1], runs[1][1])
    eager = zm.Trainer(spec, prec)
    with torchparity.dump(str(root / "eager"), model=eager.model, level="aten"):
        _accumulate_and_evaluate(eager)
    res = [torchparity.compare(str(root / a), str(root / b)) for a, b in (("eager", "compiled"), ("compiled", "eager"))]
    ok = bitwise and all(r.root_cause is None and not r.summary.get("n_error") for r in res)
    s = res[0].summary
    rcs = [r.root_cause.name if r.root_cause is not None else "none" for r in res]
    return ok, (f"2 steps x 2 micro-batches + no_grad eval; tool on == off bitwise {bitwise}; compare: {s.get('n_pass')} "
                f"pass, {s.get('n_warning')} warning, {s.get('n_error')} error; root cause {rcs[0]} (reversed: {rcs[1]})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--features", default="watch,compile,compiled-fn,compile-fault,compile-blocks,compile-accum")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--precisions", default="fp32,bf16,fp16")
    ap.add_argument("--out", default=None, help="write the Markdown table here")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)  # Inductor's CPU scatter-adds are not deterministic across threads
    import torch._inductor.config as iconf

    iconf.fallback_random = True  # dropout draws as in eager, so compiled and eager runs compare
    checks = {"watch": check_watch, "compile": check_compile, "compiled-fn": check_compiled_fn,
              "compile-fault": check_compile_fault, "compile-blocks": check_compile_blocks,
              "compile-accum": check_compile_accum}
    rows, failed = [], 0
    for name in a.models.split(","):
        for prec in a.precisions.split(","):
            for feat in a.features.split(","):
                t0 = time.perf_counter()
                with tempfile.TemporaryDirectory() as tmp:
                    try:
                        ok, note = checks[feat](name, prec, Path(tmp))
                    except Exception as exc:  # a crash is a failed check, shown with its last frame
                        ok, note = False, f"crash: {type(exc).__name__}: {exc}"[:300]
                        traceback.print_exc()
                verdict = "OK" if ok else "FAIL"
                failed += not ok
                rows.append((name, prec, feat, verdict, f"{note} ({time.perf_counter() - t0:.0f} s)"))
                print(f"{name:<12} {prec:<5} {feat:<8} {verdict:<5} {rows[-1][4]}", flush=True)
    lines = [f"usercheck, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}, "
             f"`python bench/usercheck.py {' '.join(argv if argv is not None else sys.argv[1:])}`".rstrip() + "", "",
             "| model | precision | feature | verdict | what was seen |", "|---|---|---|---|---|"]
    lines += [f"| {' | '.join(r)} |" for r in rows]
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
