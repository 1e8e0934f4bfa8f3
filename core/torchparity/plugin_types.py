"""The objects that cross the plugin boundary: device backends, checkers and reporters.

Plugins subclass these and return instances from the registration hooks in
:mod:`torchparity.hookspecs`. Everything here imports without torch; methods that need torch import
it lazily, so discovering plugins never loads torch or a vendor SDK.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, ContextManager, Mapping

from .errors import PluginError, UsageError
# helpers shared by the reporter plugins (numbers, files replaced in one step, verdict counts)
from .report_helpers import count_verdict as count_verdict
from .report_helpers import format_number as format_number
from .report_helpers import write_atomically as write_atomically

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    import pandas as pd
    import torch

    from .results import CompareResult

#: Verdicts in increasing order of severity. ``skip`` means "not judged" (e.g. a view op, an
#: unmatched row); it never hides a failure because the worst verdict wins.
VERDICTS = ("skip", "pass", "warning", "error")
VERDICT_RANK = {v: i for i, v in enumerate(VERDICTS)}


@dataclass(frozen=True)
class Availability:
    """Whether a backend can be used here, and if not, why (one line, with the fix)."""

    available: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.available


class Configurable:
    """Base for components that take options from ``plugins.yaml``.

    Subclasses declare their options as a dataclass in ``Options``; :meth:`configure` builds it
    from a mapping and rejects unknown keys with a message naming the component.
    """

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "component"

    @dataclass
    class Options:
        pass

    def __init__(self) -> None:
        self.options = self.Options()

    def configure(self, options: Mapping[str, Any] | None = None) -> None:
        options = dict(options or {})
        known = {f.name for f in dataclasses.fields(self.Options)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise PluginError(
                f"{self.kind} '{self.name}': unknown option(s) {', '.join(unknown)} in plugins.yaml; "
                f"known options: {', '.join(sorted(known)) or '(none)'}"
            )
        self.options = dataclasses.replace(self.Options(), **options)


# --------------------------------------------------------------------------------------------
# Device backends
# --------------------------------------------------------------------------------------------

#: Collective ops as they appear at the aten level (namespace ``c10d`` / ``_c10d_functional``) and
#: at the API level (``torch.distributed``). They are recorded, never re-executed.
DEFAULT_COLLECTIVE_OPS = frozenset(
    {
        "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
        "reduce_scatter_tensor", "broadcast", "send", "recv", "isend", "irecv", "all_to_all",
        "all_to_all_single", "reduce", "gather", "scatter", "barrier", "batch_isend_irecv",
        "allreduce_", "allgather_", "_allgather_base_", "reduce_scatter_", "_reduce_scatter_base_",
        "broadcast_", "alltoall_", "alltoall_base_", "reduce_", "gather_", "scatter_",
        "allgather_into_tensor_coalesced_", "allreduce_coalesced_", "wait_tensor",
    }
)


class DeviceBackend(Configurable):
    """A device torchparity can dump on, compare against, or use as a reference.

    Class attributes describe the device; methods give the operations core needs. The defaults
    work for any device that exposes a ``torch.<device_type>`` module with the usual API
    (``is_available``, ``synchronize``, ``manual_seed_all``, ``get_rng_state``...), which is what
    CUDA, ``torch_musa`` and ``torch_npu`` provide. A backend overrides what differs.
    """

    kind: ClassVar[str] = "backend"
    #: torch device type string ("cuda", "npu", "musa", "cpu"). MetaX MACA presents "cuda".
    device_type: ClassVar[str] = "cpu"
    #: human description shown by ``torchparity plugins``.
    description: ClassVar[str] = ""
    #: a vendor Python module that must be importable (``torch_npu``); ``None`` for built-in ones.
    vendor_module: ClassVar[str | None] = None
    #: True for backends that emulate a device on the CPU. Reports say "emulated" for them.
    is_emulation: ClassVar[bool] = False
    #: vendor op namespaces worth capturing at the aten level, e.g. ``("npu",)`` for torch.ops.npu.
    op_namespaces: ClassVar[tuple[str, ...]] = ()
    #: dtypes (as names) the device cannot compute, mapped to the dtype to compute them in.
    upcast_dtypes: ClassVar[Mapping[str, str]] = {}
    collective_ops: ClassVar[frozenset[str]] = DEFAULT_COLLECTIVE_OPS

    # ---- discovery -----------------------------------------------------------------------
    def is_available(self) -> Availability:
        """Whether the device and its SDK are usable here. Never raises."""
        if self.vendor_module and importlib.util.find_spec(self.vendor_module) is None:
            return Availability(False, f"Python module '{self.vendor_module}' is not installed")
        try:
            import torch

            if self.vendor_module:
                importlib.import_module(self.vendor_module)
            mod = getattr(torch, self.device_type, None)
            if mod is None or not hasattr(mod, "is_available"):
                return Availability(False, f"torch has no '{self.device_type}' device module")
            if not mod.is_available():
                return Availability(False, f"no {self.device_type} device visible to torch")
        except Exception as exc:  # a broken SDK must not break discovery
            return Availability(False, f"probing {self.name} failed: {type(exc).__name__}: {exc}")
        return Availability(True)

    # ---- device handling -----------------------------------------------------------------
    def _device_module(self) -> Any:
        import torch

        return getattr(torch, self.device_type)

    def device(self, index: int | None = None) -> torch.device:
        import torch

        return torch.device(self.device_type if index is None else f"{self.device_type}:{index}")

    def synchronize(self) -> None:
        """Wait for all queued work on the device."""
        self._device_module().synchronize()

    def to_device(self, tree: Any, index: int | None = None, non_blocking: bool = False) -> Any:
        """Move every tensor in a (nested) structure to this device. Non-tensors are kept."""
        import torch
        from torch.utils._pytree import tree_map

        dev = self.device(index)
        return tree_map(
            lambda x: x.to(dev, non_blocking=non_blocking) if isinstance(x, torch.Tensor) else x, tree
        )

    def compute_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype this device computes ``dtype`` in (itself unless listed in ``upcast_dtypes``)."""
        import torch

        name = str(dtype).replace("torch.", "")
        target = self.upcast_dtypes.get(name)
        return getattr(torch, target) if target else dtype

    def reference_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype in which this backend computes a high-precision reference of ``dtype``.

        Default: float32 for 16-bit floats, the dtype itself otherwise. The CPU backend returns
        float64 for every floating dtype.
        """
        import torch

        return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype

    def supports_dtype(self, dtype: torch.dtype) -> bool:
        return self.compute_dtype(dtype) == dtype

    # ---- reproducibility -------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        import torch

        torch.manual_seed(seed)
        mod = getattr(torch, self.device_type, None)
        if mod is not None and hasattr(mod, "manual_seed_all"):
            mod.manual_seed_all(seed)

    def set_deterministic(self, enabled: bool = True) -> None:
        import torch

        torch.use_deterministic_algorithms(enabled, warn_only=True)

    def get_rng_state(self) -> dict[str, torch.Tensor]:
        """The CPU generator state plus one ``"<device_type>:<i>"`` entry per visible device
        (the device module's ``device_count``/``get_rng_state(i)``, as torch.cuda, torch_npu and
        torch_musa provide them)."""
        import torch

        state = {"cpu": torch.get_rng_state()}
        mod = self._device_module() if self.device_type != "cpu" else None
        if mod is not None and hasattr(mod, "get_rng_state"):
            count = mod.device_count() if hasattr(mod, "device_count") else 0
            if count:
                for i in range(count):
                    state[f"{self.device_type}:{i}"] = mod.get_rng_state(i)
            else:
                state[self.device_type] = mod.get_rng_state()
        return state

    def set_rng_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restore what :meth:`get_rng_state` returned (a plain ``"<device_type>"`` key means the
        current device)."""
        import torch

        if "cpu" in state:
            torch.set_rng_state(state["cpu"])
        mod = self._device_module() if self.device_type != "cpu" else None
        if mod is None or not hasattr(mod, "set_rng_state"):
            return
        for key, value in state.items():
            if key == self.device_type:
                mod.set_rng_state(value)
            elif key.startswith(self.device_type + ":"):
                mod.set_rng_state(value, int(key.split(":", 1)[1]))

    # ---- description for dump headers ------------------------------------------------------
    def numerics_switches(self) -> dict[str, Any]:
        """Settings that change numerics (TF32, reduced-precision reductions, determinism...)."""
        import torch

        return {
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        }

    def environment(self) -> dict[str, Any]:
        """What produced a dump: device name, SDK/driver versions, torch version, switches."""
        import platform

        import torch

        return {
            "backend": self.name,
            "device_type": self.device_type,
            "emulation": self.is_emulation,
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "numerics": self.numerics_switches(),
        }

    def activate(self) -> ContextManager[Any]:
        """A context in which the user's model runs "on" this device.

        Real devices need nothing (the model is already on the device): a null context. The
        emulated backend returns a dispatch mode that changes how ops compute.
        """
        return nullcontext()


# --------------------------------------------------------------------------------------------
# Checkers
# --------------------------------------------------------------------------------------------


@dataclass
class CheckContext:
    """What a checker may need besides the data: thresholds by op/dtype from plugins.yaml etc."""

    mode: str = "statistics"  # statistics | md5 | tensor | online
    op: str = ""
    dtype: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckResult:
    """One verdict on one tensor pair (online compare) or one op (single-dump scan)."""

    checker: str
    verdict: str  # one of VERDICTS
    reason: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)


class Checker(Configurable):
    """Turns metrics into verdicts. Implement the methods for the scopes you declare."""

    kind: ClassVar[str] = "checker"
    #: where this checker applies: any of "compare", "online", "dump".
    scopes: ClassVar[frozenset[str]] = frozenset({"compare"})
    description: ClassVar[str] = ""

    def judge_rows(self, rows: pd.DataFrame, ctx: CheckContext) -> pd.DataFrame:
        """Offline compare: return a DataFrame indexed like ``rows`` with columns ``verdict`` and
        ``reason`` (``reason`` empty where it passed). Rows this checker has nothing to say about
        get ``skip``."""
        raise PluginError(f"checker {self.name} does not judge compare rows")

    def check_tensors(
        self, device: torch.Tensor, reference: torch.Tensor, ctx: CheckContext, **kw: Any
    ) -> CheckResult:
        """Online compare: judge one device output against the reference backend's output."""
        raise PluginError(f"checker {self.name} does not check tensors online")

    def scan_dump(self, frame: pd.DataFrame, ctx: CheckContext) -> pd.DataFrame:
        """Single dump (no benchmark): return per-record findings (e.g. overflow levels)."""
        raise PluginError(f"checker {self.name} does not scan dumps")


# --------------------------------------------------------------------------------------------
# Reporters
# --------------------------------------------------------------------------------------------


class Reporter(Configurable):
    """Writes a :class:`~torchparity.results.CompareResult` somewhere people look."""

    kind: ClassVar[str] = "reporter"
    description: ClassVar[str] = ""

    def write(self, result: CompareResult, output_dir: Path) -> list[Path]:
        """Write the report; return the files written (empty for console-only reporters)."""
        raise PluginError(f"reporter {self.name} does not implement write()")


class OutputDirError(UsageError, PluginError):
    """An output directory that cannot be used (a file, not creatable, not writable). A usage
    error (the CLI prints one line and exits 2); also a :class:`PluginError` for callers that
    catch what reporters raise."""


def prepare_output_dir(output_dir: Any, reporter: str | None = None, option: str = "--output") -> Any:
    """Create ``output_dir`` (and parents) for a reporter (or any writer named ``reporter``), or
    raise an :class:`OutputDirError` that says why not in one line (exists as a file, cannot be
    created: ``/proc/x``, a read-only file system, a name too long..., not writable) and what to
    do. Returns it as a Path."""
    import os
    from pathlib import Path as _Path

    who = f"reporter '{reporter}': output directory" if reporter else "output directory"
    fix = f"choose another {option}"
    try:
        out = _Path(output_dir)
        if out.exists() and not out.is_dir():
            raise OutputDirError(f"{who} {out} exists and is not a directory; {fix}")
        out.mkdir(parents=True, exist_ok=True)
    except OutputDirError:
        raise
    except (OSError, ValueError, TypeError) as exc:  # ValueError: a NUL in the path
        why = getattr(exc, "strerror", None) or str(exc)
        shown = str(output_dir) if str(output_dir).isprintable() else ascii(str(output_dir))
        raise OutputDirError(f"{who} {shown} cannot be created ({why}); {fix}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise OutputDirError(f"{who} {out} is not writable; {fix} or fix its permissions")
    return out


def write_reports(result: CompareResult, reporters: Mapping[str, Reporter], names: Any, output_dir: Any
                  ) -> tuple[dict[str, list[Path]], list[str]]:
    """Run the reporters ``names`` on ``result`` into ``output_dir``; return ``(files written by
    each reporter that succeeded, warnings)``.

    An output directory that cannot be used raises :class:`OutputDirError` (one line, exit 2)
    before any reporter runs. A reporter that fails on its own (disk full, a bug, a file it cannot
    replace) costs only its own report: one warning line, and the other reporters still write.
    """
    import errno

    out = prepare_output_dir(output_dir)
    written: dict[str, list[Path]] = {}
    warnings: list[str] = []
    for n in names:
        try:
            written[n] = list(reporters[n].write(result, out) or [])
        except OutputDirError:
            raise
        except (PluginError, OSError) as exc:
            text = str(exc) if isinstance(exc, PluginError) else \
                f"reporter '{n}': cannot write into {out} ({exc.strerror or exc})"
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC or "No space left" in text:
                text += "; free disk space and run it again"
            warnings.append(f"{text}; the {n} report is missing, the other reports were written")
        except Exception as exc:  # a reporter's bug must not cost the other reports
            warnings.append(f"reporter '{n}' failed ({type(exc).__name__}: {exc}); the {n} report is missing, "
                            f"the other reports were written")
    return written, warnings


# --------------------------------------------------------------------------------------------
# Untrusted names in what reporters write
# --------------------------------------------------------------------------------------------

#: first characters that start a formula (or DDE payload) in Excel / LibreOffice / CSV import
FORMULA_TRIGGERS = frozenset("=+-@\t\r\n\uff1d\uff0b\uff0d\uff20")
#: Excel's limit on the characters of one cell
MAX_CELL_CHARS = 32_767
_ILLEGAL_XML = re.compile(r"[\000-\010]|[\013-\014]|[\016-\037]")
_UNSAFE_FILE_CHARS = re.compile(r"[^A-Za-z0-9_.\-]+")


def is_formula_like(text: str) -> bool:
    """Whether a spreadsheet could take ``text`` for a formula (``=``, ``+``, ``-``, ``@``, tab,
    CR/LF or their full-width forms first)."""
    return text[:1] in FORMULA_TRIGGERS


def cell_text(text: str) -> str:
    """``text`` as a spreadsheet cell can hold it: characters XML cannot hold removed, cut at
    Excel's 32,767 characters."""
    return _ILLEGAL_XML.sub("", text)[:MAX_CELL_CHARS]


def set_text_cell(cell: Any, value: Any) -> Any:
    """Put ``value`` into an openpyxl cell; a string is always a text cell (openpyxl would make
    ``"=..."`` a formula), with ``quotePrefix`` when it is formula-like. Returns the cell."""
    if isinstance(value, str):
        cell.value = cell_text(value)
        cell.data_type = "s"
        if is_formula_like(cell.value):
            cell.quotePrefix = True
    else:
        cell.value = value
    return cell


def safe_file_name(name: str, limit: int = 150) -> str:
    """A file name made from an untrusted op/module/record name: only ``A-Za-z0-9_.-`` (``/``,
    ``..``, NUL... become ``_``), no leading dot or dash, at most ``limit`` characters (a cut name
    ends with a hash of the whole name, so two long names never share a file)."""
    import hashlib

    s = _UNSAFE_FILE_CHARS.sub("_", str(name)).lstrip(".-") or "_"
    if len(s) > limit:
        digest = hashlib.sha1(str(name).encode("utf-8", "surrogatepass")).hexdigest()[:10]
        s = s[: limit - 11] + "-" + digest
    return s
