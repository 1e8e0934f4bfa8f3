"""Asynchronous host copies (md5 and tensor modes): the records are those of the blocking path,
the copy is of the value as it was measured, the writer waits for each copy before reading it,
and the pinned pool stays within its budget (waiting for the writer, then copying blocking).

Without an accelerator, the stream path runs on the CPU through a fake device module whose side
stream really defers each copy until its event is waited on (so a missing snapshot, a missing
wait in the writer, or a copy read too early shows up as wrong bytes)."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from safetensors.torch import load_file
from torch.utils._python_dispatch import TorchDispatchMode

import torchparity
from torchparity.capture import host_copies
from torchparity.capture.host_copies import HostCopier, HostPool, Streams
from torchparity.capture.stats import tensor_checksum

# ---- a fake device module: copies on a side stream happen when its event is waited on ----------


class _Stream:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name
        self.queue: list[Any] = []
        self.done = 0

    def wait_stream(self, other: "_Stream") -> None:
        self.log.append(f"{self.name}.wait_stream({other.name})")

    def run(self, upto: int) -> None:
        while self.done < upto:
            self.queue[self.done]()
            self.done += 1


class _Event:
    def __init__(self) -> None:
        self.stream: _Stream | None = None
        self.upto = 0

    def record(self, stream: _Stream) -> None:
        self.stream, self.upto = stream, len(stream.queue)
        stream.log.append(f"{stream.name}.record")

    def synchronize(self) -> None:
        assert self.stream is not None, "an event waited on before it was recorded"
        self.stream.run(self.upto)


class _Defer(TorchDispatchMode):
    """Inside ``stream(side)``: every copy_ is queued on the side stream, not run."""

    def __init__(self, stream: _Stream) -> None:
        super().__init__()
        self.stream = stream

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten.copy_.default:
            dst, src = args[0], args[1]
            self.stream.queue.append(lambda: dst.copy_(src))
            self.stream.log.append(f"{self.stream.name}.copy")
            return dst
        return func(*args, **kwargs)


class FakeDevice:
    """What :class:`Streams` needs of a device module (torch.cuda and the like)."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.main = _Stream(self.log, "current")

    def current_stream(self, device: Any = None) -> _Stream:
        return self.main

    def Stream(self, device: Any = None) -> _Stream:  # noqa: N802 - the device module's name
        return _Stream(self.log, "side")

    @contextmanager
    def stream(self, s: _Stream) -> Iterator[None]:
        with _Defer(s):
            yield

    Event = _Event


# ---- the copier on its own ---------------------------------------------------------------------


def test_copy_is_of_the_value_as_measured_and_waits_for_its_event() -> None:
    dev = FakeDevice()
    copier = HostCopier(streams=Streams(dev))
    v = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    want = tensor_checksum(v)
    c = copier.copy(v)
    assert c is not None and copier.copies == 1
    v.add_(100.0)  # the next op writes in place before the side stream has copied anything
    # the side stream waited on the current stream, then copied, then recorded the event
    assert dev.log == ["side.wait_stream(current)", "side.copy", "side.record"]
    side = copier._forced.side(torch.device("cpu"))
    assert side.done == 0  # nothing copied yet: reading now would read garbage
    assert c.checksum() == want  # the writer's wait runs the copy: the snapshot, not v
    assert torch.equal(c.tensor(), torch.arange(12, dtype=torch.float32).reshape(3, 4))
    c.release()
    assert copier.pool.in_use == 0 and copier.pool.cached > 0  # the buffer is kept for reuse


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.bool, torch.int64, torch.float64])
def test_checksum_of_a_copy_equals_tensor_checksum(dtype: torch.dtype) -> None:
    v = (torch.randn(6, 5) * 3).to(dtype).t()  # not contiguous: row-major bytes of the view
    for copier in (HostCopier(), HostCopier(streams=Streams(FakeDevice()))):
        c = copier.copy(v)
        assert c is not None
        assert c.checksum() == tensor_checksum(v)
        assert torch.equal(c.tensor(), v.contiguous()) and c.tensor().dtype == dtype


def test_unsupported_values_are_declined() -> None:
    copier = HostCopier()
    assert copier.copy(torch.empty(0)) is None
    assert copier.copy(torch.empty(3, device="meta")) is None
    assert copier.copy(torch.randn(2, 2).to_sparse()) is None
    assert copier.declined == 3 and copier.copies == 0


# ---- the pool's budget -------------------------------------------------------------------------


def test_full_pool_with_nothing_handed_to_the_writer_does_not_wait() -> None:
    pool = HostPool(budget_bytes=8192)
    a = pool.take(4096, pinned=False, wait_s=60.0)
    b = pool.take(4000, pinned=False, wait_s=60.0)
    assert a is not None and b is not None and pool.in_use == 8192
    assert pool.take(1, pinned=False, wait_s=60.0) is None  # returns at once: nobody could give back
    assert pool.waits == 0
    assert pool.take(1 << 20, pinned=False, wait_s=60.0) is None  # larger than the whole budget


def test_full_pool_waits_for_the_writer_to_give_back() -> None:
    pool = HostPool(budget_bytes=8192)
    bufs = [pool.take(4096, pinned=False, wait_s=1.0) for _ in range(2)]
    pool.handed()  # these now travel with a batch to the writer

    def writer() -> None:
        while pool.waits == 0:  # give back only once the training thread is waiting
            threading.Event().wait(0.001)
        pool.give(bufs[0], 4096, reuse=True)

    t = threading.Thread(target=writer)
    t.start()
    got = pool.take(4096, pinned=False, wait_s=30.0)
    t.join()
    assert got is bufs[0] and pool.waits >= 1 and pool.in_use == 8192


def test_a_wait_that_times_out_falls_back_and_does_not_wait_again() -> None:
    pool = HostPool(budget_bytes=4096)
    buf = pool.take(4096, pinned=False, wait_s=0.0)
    pool.handed()
    assert pool.take(4096, pinned=False, wait_s=0.01) is None
    waits = pool.waits
    assert pool.take(4096, pinned=False, wait_s=60.0) is None and pool.waits == waits  # stalled: no wait
    pool.give(buf, 4096, reuse=False)  # a buffer never waited on is not reused
    assert pool.cached == 0 and pool.take(4096, pinned=False, wait_s=0.0) is not None


# ---- whole dumps: the records equal the blocking path's ----------------------------------------


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        r = torch.relu(h)
        r = torch.cat([r, r[:0]])  # an empty value: nothing to copy, no transfer
        h.mul_(3.0)  # in place right after h was measured (as addmm's output and relu's input)
        return self.b(r) + h.sum()


def _run(root: Path, level: str, mode: str, device_stats: bool, copier: HostCopier | None = None) -> Any:
    torch.manual_seed(0)
    model = _Net()
    x = torch.randn(5, 8)
    d = torchparity.dump(str(root), level=level, mode=mode, device_stats=device_stats, model=model)
    d.start()
    if copier is not None:
        d.session._copier = copier
    try:
        for _ in range(2):
            model(x).sum().backward()
            x.add_(1.0)  # in place after the dump saw x (api level does not track this write)
            model.zero_grad()
            d.step()
    finally:
        d.stop()
    return d.session._copier


def _values(root: Path, mode: str) -> dict[str, list[tuple]]:
    """Per record: (io, arg, checksum or saved tensor) of every entry, both steps."""
    out: dict[str, list[tuple]] = {}
    for rec_file in sorted(root.glob("step*/rank0/records.jsonl")):
        loaded: dict[str, dict[str, torch.Tensor]] = {}
        for line in rec_file.read_text().splitlines():
            r = json.loads(line)
            row = []
            for t in r["tensors"]:
                got: Any = t.get("md5")
                if mode == "tensor" and t.get("file"):
                    f = t["file"]
                    if f not in loaded:
                        loaded[f] = load_file(str(rec_file.parent / f))
                    got = loaded[f][t["key"]].tolist()
                row.append((t["io"], t["arg"], got))
            out[f"{rec_file.parent.parent.name}/{r['name']}"] = row
    return out


@pytest.mark.parametrize("level", ["aten", "api"])
@pytest.mark.parametrize("mode", ["md5", "tensor"])
@pytest.mark.parametrize("streams", [False, True], ids=["cpu-copy", "fake-stream"])
def test_dump_records_equal_the_blocking_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              level: str, mode: str, streams: bool) -> None:
    base = _run(tmp_path / "base", level, mode, device_stats=False)
    assert base.copies == 0  # the CPU default: hashed in place / copied at once, as before
    if streams:  # the CPU values take the accelerator path: snapshot, side stream, event
        monkeypatch.setattr(host_copies, "_streams_for", lambda device_type: Streams(FakeDevice()))
    copier = _run(tmp_path / "async", level, mode, device_stats=True)
    assert copier.copies > 5 and copier.declined == 0
    assert copier.pool.in_use == 0  # every buffer came back from the writer
    want, got = _values(tmp_path / "base", mode), _values(tmp_path / "async", mode)
    assert want.keys() == got.keys() and len(want) > 6
    assert got == want
    n = sum(1 for rows in want.values() for (_, _, v) in rows if v is not None)
    assert n > 10  # the comparison covered real checksums / tensors


def test_small_pool_falls_back_to_blocking_copies_with_the_same_records(tmp_path: Path) -> None:
    _run(tmp_path / "base", "aten", "md5", device_stats=False)
    copier = _run(tmp_path / "small", "aten", "md5", device_stats=True,
                  copier=HostCopier(budget_bytes=8192, wait_s=0.01))
    assert copier.copies > 0 and copier.declined > 0  # some values waited out / fell back
    assert copier.pool.in_use == 0 and copier.pool.in_use + copier.pool.cached <= 8192
    assert _values(tmp_path / "small", "md5") == _values(tmp_path / "base", "md5")
