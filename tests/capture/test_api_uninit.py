"""Uninitialised memory at the API level (levels ``api`` and ``mix``, issue 14).

MoE routers (Qwen2-MoE, Mixtral) do ``inv = torch.empty_like(perm); inv[perm] = arange(...)``.
The aten capture described the destination of that ``index_put_`` without measuring it, but the
API capture measured ``Tensor.__setitem__``'s input 0 while it still held whatever the allocator
left there: two identical runs "diverged" and the compare blamed ``torch.empty_like``. Both
levels now share :class:`torchparity.capture.uninit.UninitStorages`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import torchparity
from torchparity.capture.uninit import UninitStorages
from torchparity.compare.api import compare


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "step0" / "rank0" / "records.jsonl").read_text().splitlines()]


def _entry(rec: dict[str, Any], io: str, arg: str) -> dict[str, Any]:
    return next(t for t in rec["tensors"] if t["io"] == io and t["arg"] == arg)


def _router() -> torch.Tensor:
    """The MoE router's inverse permutation, then a use of it."""
    torch.manual_seed(0)
    perm = torch.randperm(8)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(8)
    return inv * 2


@pytest.mark.parametrize("level", ["api", "mix"])
def test_empty_like_destination_is_described_not_measured_until_written(tmp_path: Path, level: str) -> None:
    with torchparity.dump(str(tmp_path / "d"), level=level) as d:
        y = _router()
        d.step()
    assert torch.equal(y, _router()), "the tool changed the result"
    recs = {r["name"]: r for r in _records(tmp_path / "d")}
    empty = recs["Torch.empty_like.0.forward"]
    assert "stats" not in _entry(empty, "output", "0")
    assert empty["flags"]["unmeasured"] == {"output.0": "uninitialised memory"}
    put = recs.get("Tensor.__setitem__.0.forward")
    if put is not None:  # torch 2.1's function mode is not told about Tensor.__setitem__
        dst = _entry(put, "input", "0")
        assert dst["dtype"] == "int64" and dst["shape"] == [8] and "stats" not in dst, "garbage was measured"
        assert put["flags"]["unmeasured"] == {"input.0": "uninitialised memory"}
        assert "stats" in _entry(put, "input", "1") and "stats" in _entry(put, "input", "2")
    else:
        assert tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 4)
    # written: the next read measures values again
    mul = recs["Tensor.mul.0.forward"]
    assert _entry(mul, "input", "0")["stats"]["max"] == 7 and "unmeasured" not in mul.get("flags", {})


def test_views_out_buffers_and_reads_follow_the_aten_rule(tmp_path: Path) -> None:
    """A view of uninitialised memory is not measured; reading it (``copy_`` from it) leaves it
    uninitialised; an ``out=`` write or an in-place write through a view makes it hold values."""
    with torchparity.dump(str(tmp_path / "d"), level="api") as d:
        x = torch.ones(6)
        buf = x.new_empty(6)
        torch.add(buf.view(2, 3), 1)  # reads garbage through a view
        sink = torch.zeros(6)
        sink.copy_(buf)  # reads buf, writes sink
        torch.neg(buf)  # buf is still uninitialised
        torch.add(x, 1, out=buf)  # written through out=
        torch.mul(buf, 3)
        other = torch.empty(4)
        other.view(2, 2).fill_(5.0)  # written through a view
        torch.mul(other, 2)
        d.step()
    recs = {r["name"]: r for r in _records(tmp_path / "d")}
    assert recs["Tensor.new_empty.0.forward"]["flags"]["unmeasured"] == {"output.0": "uninitialised memory"}
    add0 = recs["Torch.add.0.forward"]
    assert "stats" not in _entry(add0, "input", "0") and add0["flags"]["unmeasured"] == {"input.0": "uninitialised memory"}
    assert "stats" not in _entry(recs["Torch.neg.0.forward"], "input", "0")
    add1 = recs["Torch.add.1.forward"]
    assert add1["flags"]["unmeasured"] == {"input.out": "out= buffer"}
    assert _entry(recs["Torch.mul.0.forward"], "input", "0")["stats"]["max"] == 2.0
    assert _entry(recs["Torch.mul.1.forward"], "input", "0")["stats"]["max"] == 5.0


def test_two_identical_api_dumps_of_the_router_agree(tmp_path: Path) -> None:
    for name in ("a", "b"):
        with torchparity.dump(str(tmp_path / name), level="api") as d:
            for _ in range(2):
                torch.manual_seed(0)
                junk = torch.full((64,), float(len(name)) * 1e6)  # leaves different bytes to reuse
                del junk
                perm = torch.randperm(8)
                inv = torch.empty_like(perm)
                inv[perm] = torch.arange(8)
                (inv.float() * 2).sum()
                d.step()
    s = compare(str(tmp_path / "a"), str(tmp_path / "b")).summary
    assert not s["diverged"] and s["n_error"] == 0 and s["n_warning"] == 0, s["first_divergence"]
    assert s["n_not_compared"] == 0 and s["complete"]


def test_after_call_keeps_views_and_reads_and_clears_fresh_results() -> None:
    u = UninitStorages()
    a = torch.empty(4)
    u.after_call(True, [a])
    assert u.holds(a)
    u.after_call(False, [a.view(2, 2)], inputs=[a])  # a view: same storage as an input
    assert u.holds(a)
    b = torch.zeros(4)
    u.after_call(False, [b], inputs=[a])  # fresh memory (maybe the allocator's reused block)
    assert u.holds(a)
    u.restore([(b.untyped_storage().data_ptr(), b._version)])
    u.after_call(False, [b], inputs=[a])
    assert not u.holds(b) and u.holds(a)
    held = u.held([a, b])
    u.written([a, b])
    assert not u
    u.restore(held)
    assert u.holds(a) and not u.holds(b)
    u.after_call(False, [], written=[a[1:]], inputs=[a])  # any write through a view
    assert not u


def test_a_write_the_capture_did_not_see_unmarks_the_storage() -> None:
    """torch 2.1's function mode never sees ``inv[perm] = ...``: the version counter (shared by
    every view, bumped by every in-place write) tells that the memory now holds values, so the
    next read is measured instead of silently described."""
    u = UninitStorages()
    a = torch.empty(4)
    u.after_call(True, [a])
    assert u.holds(a[1:])
    a[torch.tensor([0, 1, 2, 3])] = torch.arange(4.0)  # no after_call: unseen
    assert not u.holds(a) and not u
