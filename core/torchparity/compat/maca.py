"""MetaX MACA accuracy-recorder entry points (``maca_tools.accuracy``) over torchparity's engine.

Replace ``from maca_tools import accuracy`` with ``from torchparity.compat import maca as accuracy``;
the calls of the MetaX guide work unchanged::

    accuracy.start_record(record_level=2, skip=10, op_range=[None, "torch.nn.Conv1d.6.fwd"])
    output = m_d(input_d)
    accuracy.record_switch(False)
    accuracy.gen_report("./record_cpu", "./record_maca", "./")   # -> ./maca_accuracy_report.xlsx

The recording is a torchparity dump (level ``mix``: ``torch.nn`` modules and Python API calls)
in ``output_dir`` (``output_dir/step{S}/rank{R}/records.jsonl``); every record also gets its MetaX
sequence name, ``<API>.<n>.<fwd|bwd>`` (``torch.nn.Conv1d.6.fwd``: the forward op numbered 6 in
execution order, from 0), and when recording is switched off or the process ends one ``.pt`` file
per record is written under ``output_dir`` with that name (``torch.load(..., weights_only=True)``
reads it). What each parameter maps to:

* ``record_level`` 2 → tensors saved (``mode="tensor"``), 1 → TensorSummary only (dtype, shape,
  stride, max, min; ``mode="statistics"``), 0 → no input/output information (names only);
* ``record_stack`` → ``stack``; ``record_input`` / ``record_output`` → ``io``;
* ``op_range`` → the engine's ``op_range`` with ``op_range_end="exclusive"`` (the guide's range
  is closed-open; ``None`` leaves an end open); bounds are MetaX sequence names or torchparity names;
* ``op_list`` → the engine's ``ops``: a bare API name (``"relu"``) is an API family
  (``family:relu`` = torch.relu, torch.relu_, Tensor.relu, nn.ReLU, F.relu_; not prelu/relu6), a
  sequence name (``"torch.nn.Conv1d.6.fwd"``) one op (``seq:...``), anything else a pattern;
* ``skip`` → the engine's ``skip``: every ``skip``-th op is recorded (0 = every op);
* ``ranks`` (ranks of ``process_group``, default the whole world) → the engine's ``ranks``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import UsageError
from ..plugin_types import prepare_output_dir, safe_file_name, set_text_cell

log = logging.getLogger("torchparity")

__all__ = ["start_record", "record", "record_switch", "stop_record", "gen_report", "REPORT_NAME", "REPORT_COLUMNS"]

REPORT_NAME = "maca_accuracy_report.xlsx"
REPORT_COLUMNS = ("op", "tensor", "device0_dtype", "device1_dtype", "device0_shape", "device1_shape",
                  "device0_max", "device0_min", "device1_max", "device1_min", "diff1", "diff2", "stack")

_SEQ = re.compile(r"^.+\.\d+\.(fwd|bwd)$")
_current: "_Recorder | None" = None


def _ops_patterns(op_list: Sequence[str]) -> list[str] | None:
    out = []
    for item in op_list or []:
        if not isinstance(item, str) or not item:
            raise UsageError(f"op_list entries must be non-empty strings (got {item!r})")
        if _SEQ.match(item):
            out.append("seq:" + item)
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", item):
            out.append("family:" + item)
        else:
            out.append(item)
    return out or None


def _global_ranks(process_group: Any, ranks: Sequence[int]) -> list[int] | None:
    """Ranks of ``process_group`` (default: the whole world) as global ranks; None = all."""
    ranks = list(ranks or [])
    if any(not isinstance(r, int) or r < 0 for r in ranks):
        raise UsageError(f"ranks must be non-negative ints (got {ranks!r})")
    if process_group is None:
        return ranks or None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise UsageError("process_group given but torch.distributed is not initialized; "
                         "call start_record after init_process_group")
    size = dist.get_world_size(process_group)
    members = ranks or list(range(size))
    bad = [r for r in members if r >= size]
    if bad:
        raise UsageError(f"ranks {bad} are not in the process group (size {size})")
    return [dist.get_global_rank(process_group, r) if hasattr(dist, "get_global_rank")
            else dist.distributed_c10d._get_global_rank(process_group, r) for r in members]


def _options(output_dir: str, record_level: int, record_stack: bool, record_input: bool, record_output: bool,
             op_range: Sequence[str | None] | None, op_list: Sequence[str], skip: int, process_group: Any,
             ranks: Sequence[int]) -> dict[str, Any]:
    if record_level not in (0, 1, 2):
        raise UsageError(f"record_level must be 0, 1 or 2 (got {record_level!r})")
    if not isinstance(skip, int) or skip < 0:
        raise UsageError(f"skip must be an int >= 0 (got {skip!r})")
    if op_range:
        if len(op_range) != 2:
            raise UsageError("op_range takes [] or two names, e.g. [None, 'torch.nn.Conv1d.6.fwd']")
        rng: list[str | None] | None = None if op_range[0] is None and op_range[1] is None else list(op_range)
    else:
        rng = None
    io = [n for n, on in (("input", record_input), ("output", record_output)) if on]
    if record_level == 0:
        io = []
    return dict(path=str(output_dir), level="mix", mode="tensor" if record_level == 2 else "statistics",
                io=None if len(io) == 2 else io, stack=bool(record_stack), op_range=rng, op_range_end="exclusive",
                ops=_ops_patterns(op_list), skip=skip, ranks=_global_ranks(process_group, ranks), seq_names=True,
                params=False)


class _Recorder:
    """One recording: a torchparity dump plus the export of per-record ``.pt`` files."""

    def __init__(self, options: dict[str, Any]) -> None:
        import torchparity

        self.path = Path(options["path"])
        self.level_io = options["io"]
        self.dumper = torchparity.dump(**options)
        self.dumper.start()
        self.on = True

    def switch(self, enabled: bool) -> None:
        s = self.dumper.session
        if s is None:
            return
        if enabled:
            s.enabled_step = s._step_enabled()
            self.on = True
        else:
            self.dumper._finish_step_records()  # backward records still waiting for gradients
            s.enabled_step = False
            self.on = False
            self.dumper.flush()

    def stop(self) -> None:
        s = self.dumper.session
        rng = self.dumper.options.op_range
        self.dumper.stop()
        if s is not None and rng is not None and not s._in_range:
            log.warning("maca recorder: op_range start %r was never reached; nothing was recorded "
                        "(names look like torch.nn.Conv1d.6.fwd; see the .pt names of a recording without op_range)",
                        rng[0])
        _export_pt(self.path)


def start_record(enabled: bool = True, output_dir: str = "./record_dir", record_level: int = 2,
                 record_stack: bool = True, record_input: bool = True, record_output: bool = True,
                 op_range: Sequence[str | None] | None = None, op_list: Sequence[str] = (), skip: int = 0,
                 process_group: Any = None, ranks: Sequence[int] = ()) -> None:
    """Start recording the Python ops that follow (see the module docstring for each parameter).

    A recording already running is finished first. ``enabled=False`` records nothing."""
    global _current
    opts = _options(output_dir, record_level, record_stack, record_input, record_output, op_range,
                    list(op_list or []), skip, process_group, ranks)
    stop_record()
    if not enabled:
        return
    _current = _Recorder(opts)


def record_switch(enabled: bool) -> None:
    """Pause (``False``) or resume (``True``) the running recording. Pausing writes what was
    recorded to disk (the dump and its ``.pt`` files are completed when the process ends or on
    :func:`stop_record`)."""
    if not isinstance(enabled, bool):
        raise UsageError(f"record_switch takes True or False (got {enabled!r})")
    if _current is None:
        if enabled:
            log.warning("record_switch(True): no recording was started; call start_record first")
        return
    _current.switch(enabled)


def stop_record() -> None:
    """Finish the running recording: close the dump and write the per-record ``.pt`` files
    (torchparity addition; also done at interpreter exit)."""
    global _current
    rec, _current = _current, None
    if rec is not None:
        rec.stop()


@contextlib.contextmanager
def record(enabled: bool = True, output_dir: str = "./record_dir", record_level: int = 2,
           record_stack: bool = True, record_input: bool = True, record_output: bool = True,
           op_range: Sequence[str | None] | None = None, op_list: Sequence[str] = (), skip: int = 0,
           process_group: Any = None, ranks: Sequence[int] = ()) -> Iterator[None]:
    """``with record(...):`` records the ops of the block (same parameters as :func:`start_record`);
    the recording is complete on disk when the block ends."""
    start_record(enabled, output_dir, record_level, record_stack, record_input, record_output, op_range,
                 op_list, skip, process_group, ranks)
    try:
        yield
    finally:
        stop_record()


@atexit.register
def _finish_at_exit() -> None:
    try:
        stop_record()
    except Exception as exc:  # pragma: no cover - best effort at exit
        log.error("maca recorder: could not finish the recording: %s", exc)


# ---- per-record .pt files ----------------------------------------------------------------------



def _seq_of(flags: Any, name: str) -> str:
    seq = flags.get("seq_name") if isinstance(flags, dict) else None
    return seq or name


def _export_pt(path: Path) -> None:
    """One ``<sequence name>.pt`` per record of the dump in ``path``: ``{"name", "op", "inputs",
    "outputs", "stack"}`` with tensors (level 2) or TensorSummary dicts (level 1/0)."""
    import torch

    from ..dump.reader import open_dump

    try:
        reader = open_dump(path)
    except Exception:  # nothing recorded (e.g. every op filtered out)
        return
    df = reader.frame()
    if df.empty:
        return
    for (step, rank), unit in df.groupby(["step", "rank"], sort=True):
        stacks = reader.stacks(int(step), int(rank))
        multi = len(reader.units) > 1
        for rid, rows in unit.groupby("record_id", sort=True):
            first = rows.iloc[0]
            seq = _seq_of(first["flags"], str(first["name"]))
            data: dict[str, Any] = {"name": seq, "torchparity_name": str(first["name"]), "op": str(first["op"]),
                                    "inputs": {}, "outputs": {}, "stack": []}
            sid = first["stack"]
            if sid is not None and sid == sid:
                data["stack"] = list(stacks.get(int(sid), []))
            for r in rows.itertuples(index=False):
                side = "outputs" if r.io == "output" else "inputs"
                if r.kind != "tensor":
                    data[side][str(r.arg)] = r.value if isinstance(r.value, (int, float, bool, str, type(None))) else str(r.value)
                    continue
                ref = r.tensor
                if ref is not None and ref.exists():
                    data[side][str(r.arg)] = ref.load()
                else:
                    summary = {"dtype": r.dtype, "shape": list(r.shape) if r.shape is not None else None,
                               "stride": list(r.stride) if r.stride is not None else None}
                    if r.max == r.max and r.max is not None:
                        summary.update(max=float(r.max), min=float(r.min))
                    data[side][str(r.arg)] = summary
            sub = Path(path, f"step{int(step)}_rank{int(rank)}") if multi else Path(path)
            sub.mkdir(parents=True, exist_ok=True)
            torch.save(data, sub / (safe_file_name(seq) + ".pt"))  # seq comes from the dump: untrusted


# ---- report --------------------------------------------------------------------------------------


class _Side:
    """Sequence names and call stacks of one recording's records."""

    def __init__(self, path: str) -> None:
        from ..dump.reader import open_dump

        self.reader = open_dump(path)
        frame = self.reader.frame()
        self.meta: dict[tuple[int, int, int], tuple[str, Any]] = {}
        for step, rank, rid, name, flags, sid in frame[["step", "rank", "record_id", "name", "flags", "stack"]] \
                .drop_duplicates(["step", "rank", "record_id"]).itertuples(index=False, name=None):
            self.meta[(int(step), int(rank), int(rid))] = (_seq_of(flags, str(name)), sid)
        self._stacks: dict[tuple[int, int], dict[int, list[str]]] = {}

    def describe(self, step: int, rank: int, rid: int, fallback: Any) -> tuple[str, str]:
        seq, sid = self.meta.get((step, rank, rid), (str(fallback), None))
        if sid is None or sid != sid:
            return seq, ""
        if (step, rank) not in self._stacks:
            self._stacks[(step, rank)] = self.reader.stacks(step, rank)
        return seq, "\n".join(self._stacks[(step, rank)].get(int(sid), []))



def gen_report(dir0: str, dir1: str, output_dir: str = "./") -> str:
    """Compare the recordings of device0 (``dir0``, the reference: CUDA or CPU) and device1
    (``dir1``, e.g. MXMACA) and write ``output_dir/maca_accuracy_report.xlsx``: one row per tensor
    with both sides' dtype, shape, max and min, ``diff1`` (relative error ‖x1−x0‖₂/‖x0‖₂ for
    saved tensors, the statistics' relative error for level-1 recordings), ``diff2`` (the
    standard deviation of the error, √mean((x1−x0)²), saved tensors only) and the op's Python
    call stack. Returns the report's path."""
    import torchparity
    from openpyxl import Workbook
    from openpyxl.styles import Font, PatternFill

    for d in (dir0, dir1):
        if not Path(d).exists():
            raise UsageError(f"record directory {d} does not exist")
    stop_record()  # a recording of this process must be complete before it is read
    res = torchparity.compare(dir1, dir0, output_dir=None)
    rows = res.rows
    if "order" in rows.columns:
        rows = rows.sort_values("order", kind="stable")
    sides = {1: _Side(dir1), 0: _Side(dir0)}  # names and stacks of each side's records

    out = prepare_output_dir(output_dir, option="gen_report(output_dir=...)")
    wb = Workbook()
    ws = wb.active
    ws.title = "report"
    ws.append(list(REPORT_COLUMNS))
    for c in ws[1]:
        c.font = Font(bold=True)
    red = PatternFill("solid", fgColor="FFC7CE")
    rid_col = "d_record_id" if "d_record_id" in rows.columns else "device_record_id"
    brid_col = "bench_record_id" if "bench_record_id" in rows.columns else "b_record_id"

    def num(v: Any) -> Any:
        try:
            f = float(v)
        except (TypeError, ValueError):
            return None
        return f if f == f else None

    for r in rows.itertuples(index=False):
        if getattr(r, "kind", "tensor") != "tensor":
            continue
        d_rid, b_rid = num(getattr(r, rid_col)), num(getattr(r, brid_col))
        if d_rid is not None and d_rid >= 0:
            seq, stack = sides[1].describe(int(r.step), int(r.rank), int(d_rid), r.device_name)
        else:  # only device0 has this op
            seq, stack = sides[0].describe(int(r.step), int(r.rank), int(b_rid if b_rid is not None else -1), r.bench_name)
        diff1 = num(getattr(r, "rel_l2", None))
        if diff1 is None:
            diff1 = num(getattr(r, "error", None))
        diff2 = num(getattr(r, "rmse", None))
        shape = lambda s: "" if s is None or s != s else str(list(s))  # noqa: E731
        values = [seq, r.tensor, r.bench_dtype, r.device_dtype, shape(r.bench_shape), shape(r.device_shape),
                  num(r.bench_max), num(r.bench_min), num(r.device_max), num(r.device_min), diff1, diff2, stack]
        row = ws.max_row + 1
        for col, v in enumerate(values, 1):  # names and stacks come from the dumps: text, never formulas
            set_text_cell(ws.cell(row=row, column=col), None if v is None or v != v else v)
        if getattr(r, "status", None) == "error" or (diff1 is not None and diff1 > 1e-2):
            for c in ws[ws.max_row]:
                c.fill = red
    path = out / REPORT_NAME
    tmp = path.with_name("~$" + path.name)
    try:
        wb.save(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise UsageError(f"gen_report: cannot write {path} ({exc.strerror or exc}); free space or choose "
                         "another output_dir") from None
    return str(path)
