"""Dump options: one dataclass, filled from keyword arguments, a YAML file, or an msprobe config.json."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..records import LEVELS, MODES

from .schedule import LIGHT_TIERS, check_schedule, tier_of  # noqa: F401 (LIGHT_TIERS re-exported)

PHASE_NAMES = ("forward", "backward", "optimizer", "recompute")


@dataclass
class DumpOptions:
    """Everything that controls a dump. See docs/dump.md for each option."""

    path: str = "torchparity-dump"
    level: str = "aten"  # module | api | aten | mix (module + api)
    mode: str = "statistics"  # statistics | md5 | tensor
    steps: list[int] | None = None  # None = every step
    ranks: list[int] | None = None  # None = every rank
    phases: list[str] | None = None  # forward / backward / optimizer / recompute; None = all
    io: list[str] | None = None  # input / output (params and grads follow "input"); None = both
    ops: list[str] | None = None  # include patterns on name / op / base name (fnmatch, or "re:..." regex)
    exclude_ops: list[str] | None = None
    scope: list[str] | None = None  # module path patterns; ops outside are not recorded
    op_range: list[str | None] | None = None  # [first, last] record or sequence names; None = open end
    op_range_end: str = "inclusive"  # inclusive: [first, last]; exclusive: [first, last) (MetaX recorder)
    skip: int = 1  # record every N-th op that passes the other filters (0 or 1: every op)
    seq_names: bool = False  # store each api/module record's sequence name ("torch.nn.Conv1d.6.fwd") in flags
    stack: bool | None = None  # record call stacks (default: on for module/api/mix, off for aten)
    params: bool = True  # module level: record parameters and parameter gradients
    backward: bool = True  # capture backward ops / gradients
    max_bytes: int | None = None  # budget for saved tensors (tensor mode); records continue after it
    batch_size: int = 256  # records per write batch (a killed process loses at most one batch)
    fsync: bool = True  # fsync each batch (crash safety against power loss, not only kills)
    max_queue_bytes: int = 1 << 30  # tensors waiting for the writer thread before training waits
    # measure CPU tensors through the batched device path, as on an accelerator (one kernel per
    # value, one host copy per flush): for tests and the counting bench; off = read at once
    device_stats: bool = False
    backend: str | None = None  # device backend: described in the header and activated around the run (default: guessed, not activated)
    # ---- when to capture (docs/dump.md "When to capture"): a step is captured fully when it is
    # in ``steps`` (if given) and a multiple of ``every`` (if given); with ``light``, every other
    # step records the light tier instead of nothing
    every: int | None = None  # full capture on steps 0, N, 2N, ... (None = every step)
    light: str | None = None  # between full steps: "module" = module records, statistics only (None = nothing)
    # record each parameter's gradient hash (after the all-reduce) and parameter hash (after the
    # step) per rank in DIR/replicas/, for `torchparity replicas DIR` (docs/replicas.md)
    replica_check: bool = False
    # Parquet summaries (docs/query.md): "off" (default: none while training, the first
    # `torchparity query` writes them), at each step's end ("step"), or at the dump's close ("close")
    summaries: str = "off"
    def __post_init__(self) -> None:
        if isinstance(self.path, os.PathLike):
            self.path = os.fspath(self.path)
        if not isinstance(self.path, str) or not self.path.strip() or "\0" in self.path:
            raise UsageError(f"path must be a directory name (got {self.path!r})")
        if self.level == "L0":
            self.level = "module"
        if self.level not in LEVELS:
            raise UsageError(f"level must be one of {', '.join(LEVELS)} (got {self.level!r})")
        if self.mode not in MODES:
            raise UsageError(f"mode must be one of {', '.join(MODES)} (got {self.mode!r})")
        for name in ("phases",):
            bad = set(getattr(self, name) or []) - set(PHASE_NAMES)
            if bad:
                raise UsageError(f"{name}: unknown value(s) {sorted(bad)}; use {', '.join(PHASE_NAMES)}")
        bad_io = set(self.io or []) - {"input", "output"}
        if bad_io:
            raise UsageError(f"io: unknown value(s) {sorted(bad_io)}; use input and/or output")
        if not isinstance(self.skip, int) or self.skip < 0:
            raise UsageError("skip must be an int >= 0 (record every N-th op; 0 or 1 = every op)")
        if self.op_range is not None:
            if not isinstance(self.op_range, (list, tuple)) or len(self.op_range) != 2 \
                    or not all(x is None or (isinstance(x, str) and x) for x in self.op_range):
                raise UsageError("op_range takes two record names: [first, last] (None = no bound)")
            self.op_range = list(self.op_range)
        if self.op_range_end not in ("inclusive", "exclusive"):
            raise UsageError(f"op_range_end must be inclusive or exclusive (got {self.op_range_end!r})")
        if not isinstance(self.device_stats, bool):
            raise UsageError(f"device_stats must be true or false (got {self.device_stats!r}); it measures CPU "
                             f"tensors through the batched accelerator path")
        if not isinstance(self.replica_check, bool):
            raise UsageError(f"replica_check must be true or false (got {self.replica_check!r})")
        if self.summaries not in ("step", "close", "off"):
            raise UsageError(f"summaries must be step, close or off (when the Parquet summaries are written; "
                             f"got {self.summaries!r})")
        if self.stack is None:
            self.stack = self.level != "aten"
        self._check_schedule()

    def _check_schedule(self) -> None:
        """Validate ``steps``, ``every`` and ``light`` (one-line errors naming the option)."""
        self.steps = check_schedule(self.steps, self.every, self.light)

    @property
    def scheduled(self) -> bool:
        """True when some steps are not captured fully (every/steps given)."""
        return self.every is not None or self.steps is not None

    def tier(self, step: int) -> str | None:
        """What step ``step`` records: ``"full"`` (the configured level and mode), ``"light"``
        (module records, statistics) or None (nothing). Ranks are not considered here."""
        return tier_of(step, self.steps, self.every, self.light)

    def light_options(self) -> "DumpOptions":
        """The options in force on light steps: module level, statistics; every filter kept."""
        return dataclasses.replace(self, level="module", mode="statistics", steps=None, every=None, light=None,
                                   max_bytes=None)

    @property
    def levels(self) -> set[str]:
        return {"module", "api"} if self.level == "mix" else {self.level}

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_output_dir(path: str | os.PathLike[str], what: str = "dump path") -> None:
    """Raise :class:`UsageError` (one line) unless ``path`` is, or can be made, a writable
    directory: checked by creating it and a probe file in it, so that a read-only file system, a
    directory without write permission or a path that is a file is refused before training
    starts, not discovered by the writer thread afterwards (root passes permission bits, so the
    probe is a real write, not ``os.access``)."""
    import tempfile

    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{what} {p} is a file, not a directory; choose a directory (it is created if missing)")
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".torchparity-probe-", dir=p)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = " ".join(str(exc.strerror or exc).split())
        raise UsageError(f"{what} {p} is not writable ({reason}); choose a directory you can write to") from None


# ---- pattern matching -------------------------------------------------------------------------


SEQ_NAME = re.compile(r"^(?P<api>.+)\.(?P<n>\d+)\.(?P<dir>fwd|bwd)$")


def api_family(name: str) -> str:
    """The API family of a name: last dotted part, without in-place/dunder decoration, lower case
    (``torch.relu_``, ``Tensor.relu``, ``ReLU``, ``F.relu_`` → ``relu``; ``prelu``, ``relu6`` stay)."""
    base = name.rsplit(".", 1)[-1]
    if base.startswith("__") and base.endswith("__"):
        base = base[2:-2]
        if base.startswith("i") and base[1:] in ("add", "sub", "mul", "truediv", "floordiv", "and", "or", "xor",
                                                 "pow", "mod", "lshift", "rshift", "matmul"):
            base = base[1:]
    return base.rstrip("_").lower()


def _family_test(family: str) -> Any:
    fam = family.lower()
    return lambda n: api_family(n) == fam


def compile_patterns(patterns: list[str] | None) -> list[Any] | None:
    """fnmatch patterns (``aten.mm*``, ``*linear*``), regexes written ``re:...``, API families
    written ``family:relu`` (every relu API: torch.relu, torch.relu_, Tensor.relu, nn.ReLU,
    F.relu_; not prelu or relu6). Sequence names (``seq:torch.nn.Conv1d.6.fwd``) are matched by
    the capture session after numbering and are left out here."""
    if not patterns:
        return None
    out = []
    for p in patterns:
        if p.startswith("seq:"):
            continue
        if p.startswith("family:"):
            out.append(_family_test(p[len("family:"):]))
        elif p.startswith("re:"):
            out.append(re.compile(p[3:]).search)
        elif p.startswith("name-regex(") and p.endswith(")"):  # msprobe spelling
            out.append(re.compile(p[len("name-regex("):-1]).search)
        else:
            out.append(re.compile(fnmatch.translate(p)).match)
    return out


def matches(compiled: list[Any] | None, *names: str) -> bool:
    """True when any pattern matches any of the names (or when there are no patterns)."""
    if compiled is None:
        return True
    return any(test(n) for test in compiled for n in names if n)


# ---- loading from files ------------------------------------------------------------------------

_FIELDS = {f.name for f in dataclasses.fields(DumpOptions)}
_MSPROBE_TOP = {"task", "dump_path", "rank", "step", "level", "seed", "is_deterministic", "enable_dataloader",
                "acl_config", "statistics", "tensor", "overflow_check", "structure", "free_benchmark",
                "run_ut", "grad_probe", "extra_info", "async_dump", "precision", "risk_level", "dump_enable",
                "custom_op_namespaces", "framework"}
_MSPROBE_TASK_KEYS = {"scope", "list", "data_mode", "summary_mode", "file_format", "backward_input",
                      "tensor_list", "overflow_nums", "check_mode", "slice", "bench_path", "diff_nums"}
_MSPROBE_LEVELS = {"L0": "module", "L1": "api", "L2": "aten", "mix": "mix"}


def _ranges(value: Any, key: str) -> list[int] | None:
    """msprobe-style rank/step lists: [] = all; ints or "a-b" strings."""
    if value in (None, [], ""):
        return None
    if not isinstance(value, list):
        raise UsageError(f"'{key}' must be a list of ints or 'a-b' ranges")
    out: list[int] = []
    for v in value:
        if isinstance(v, int):
            out.append(v)
        elif isinstance(v, str) and re.fullmatch(r"\s*\d+\s*-\s*\d+\s*", v):
            a, b = (int(x) for x in v.split("-"))
            out.extend(range(a, b + 1))
        elif isinstance(v, str) and v.strip().isdigit():
            out.append(int(v))
        else:
            raise UsageError(f"'{key}': bad entry {v!r}; use ints or 'a-b' ranges")
    return out


def from_msprobe(cfg: dict[str, Any], source: str = "config.json") -> dict[str, Any]:
    """Map an msprobe ``config.json`` to DumpOptions keyword arguments."""
    unknown = set(cfg) - _MSPROBE_TOP
    if unknown:
        raise UsageError(f"{source}: unknown msprobe key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_MSPROBE_TOP))}")
    task = cfg.get("task", "statistics")
    if task not in ("statistics", "tensor", "structure", "overflow_check"):
        raise UsageError(f"{source}: task '{task}' has no torchparity dump equivalent; use statistics, tensor, structure or overflow_check")
    opts: dict[str, Any] = {}
    if "dump_path" in cfg:
        opts["path"] = cfg["dump_path"]
    opts["ranks"] = _ranges(cfg.get("rank"), "rank")
    opts["steps"] = _ranges(cfg.get("step"), "step")
    level = cfg.get("level", "L1")
    if level not in _MSPROBE_LEVELS:
        raise UsageError(f"{source}: level '{level}' is not one of L0, L1, L2, mix")
    opts["level"] = _MSPROBE_LEVELS[level]
    section = cfg.get(task) or {}
    unknown = set(section) - _MSPROBE_TASK_KEYS
    if unknown:
        raise UsageError(f"{source}: unknown key(s) in '{task}': {', '.join(sorted(unknown))}")
    mode = "tensor" if task == "tensor" else "statistics"
    if section.get("summary_mode") in ("md5", "xor"):
        mode = "md5"
    opts["mode"] = mode
    if section.get("scope"):
        scope = list(section["scope"])
        # msprobe: two names = a start..end range of ops/modules; module paths otherwise
        if len(scope) == 2 and all("." in s and s.split(".")[0] in ("Module", "Functional", "Torch", "Tensor", "Aten", "Distributed") for s in scope):
            opts["op_range"] = scope
        else:
            opts["scope"] = scope
    if section.get("list"):
        lst = [str(x) for x in section["list"]]
        opts["ops"] = [x if any(ch in x for ch in "*?[") or x.startswith(("re:", "name-regex(")) else f"*{x}*" for x in lst]
    data_mode = section.get("data_mode") or ["all"]
    if "all" not in data_mode:
        phases = [m for m in data_mode if m in ("forward", "backward")]
        ios = [m for m in data_mode if m in ("input", "output")]
        if phases:
            opts["phases"] = phases + (["recompute"] if "forward" in phases else [])
        if ios:
            opts["io"] = ios
    if task == "structure":
        opts["level"] = "module" if opts["level"] not in ("module", "mix") else opts["level"]
    if cfg.get("extra_info") is False:
        opts["stack"] = False
    return opts


def load_options_file(path: str | Path) -> dict[str, Any]:
    """Keyword arguments for DumpOptions from a torchparity YAML or an msprobe config.json."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"dump config {p} does not exist")
    text = p.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"{p} is not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {exc}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise UsageError(f"{p}: expected a mapping of options")
    if "task" in data or "dump_path" in data:
        return from_msprobe(data, str(p))
    data = dict(data.get("dump", data))
    unknown = set(data) - _FIELDS
    if unknown:
        raise UsageError(f"{p}: unknown dump option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_FIELDS))}")
    return data
