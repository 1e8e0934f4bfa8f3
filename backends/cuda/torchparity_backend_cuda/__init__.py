"""torchparity backend for NVIDIA GPUs through ``torch.cuda``.

What it adds to the generic :class:`~torchparity.plugin_types.DeviceBackend`:

* the numerics switches that change CUDA results (TF32 for matmul and cuDNN, fp16/bf16
  reduced-precision reductions in cuBLAS, cuDNN determinism/benchmark, ``CUBLAS_WORKSPACE_CONFIG``,
  ``float32_matmul_precision``) recorded in the dump header, and settable for a comparison run
  through :class:`CudaBackend.Options` and :meth:`CudaBackend.apply_numerics`;
* the header: device name and compute capability, CUDA runtime (``torch.version.cuda``), driver
  (``cuDriverGetVersion`` from ``libcuda``), cuDNN and NCCL versions;
* RNG state of every visible GPU, not just the current one;
* refusal to claim a MetaX MACA GPU: MetaX's PyTorch build presents itself as device ``cuda``
  too, so :func:`metax_markers` looks for its vendor markers and the ``maca`` backend takes it.

Nothing here imports torch at module import time.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional

from torchparity import hookimpl
from torchparity.errors import UsageError
from torchparity.plugin_types import Availability, DeviceBackend

if TYPE_CHECKING:  # pragma: no cover
    import torch

__version__ = "0.1.0"

#: Value PyTorch documents for deterministic cuBLAS (":16:8" also works, with less memory).
DETERMINISTIC_CUBLAS_WORKSPACE = ":4096:8"

#: Python modules that only exist in MetaX's PyTorch stack (seen in public MetaX code).
METAX_MODULES = ("torch_maca", "mcpytorch")
#: Environment variables set by the MetaX MACA SDK's environment scripts (weak marker).
METAX_ENV_VARS = ("MACA_PATH", "MACA_HOME")


def metax_markers(probe_device: bool = True) -> dict[str, str]:
    """Evidence that this process runs MetaX's MACA PyTorch build, as ``{marker: value}``.

    Strong markers (any one means MetaX):

    * ``torch.version.maca`` is set (MetaX builds report e.g. ``'3.8.1.0'`` while
      ``torch.version.cuda`` still says ``'11.6'``);
    * a MetaX-only Python module is importable (``torch_maca``, ``mcpytorch``; only
      ``find_spec``, nothing is imported);
    * the device name contains ``MetaX`` (``'MetaX C550'``), only when ``probe_device`` and a
      device is visible.

    Weak marker, reported as ``env:<VAR>`` but never sufficient alone: ``MACA_PATH`` /
    ``MACA_HOME`` (an SDK may be installed on a machine that also has NVIDIA GPUs).
    """
    found: dict[str, str] = {}
    torch = sys.modules.get("torch")
    if torch is None:
        import torch  # noqa: F811 - imported lazily on purpose
    version = getattr(getattr(torch, "version", None), "maca", None)
    if version:
        found["torch.version.maca"] = str(version)
    for mod in METAX_MODULES:
        try:
            if mod in sys.modules or importlib.util.find_spec(mod) is not None:
                found[f"module:{mod}"] = "importable"
        except (ImportError, ValueError):  # a broken spec is no evidence either way
            pass
    if probe_device:
        try:
            if torch.cuda.is_available() and torch.cuda.device_count() > 0:
                name = torch.cuda.get_device_name(0)
                if "metax" in name.lower():
                    found["device_name"] = name
        except Exception:  # pragma: no cover - a broken driver is reported by is_available
            pass
    for var in METAX_ENV_VARS:
        if os.environ.get(var):
            found[f"env:{var}"] = os.environ[var]
    return found


def strong_metax_markers(markers: Mapping[str, str]) -> dict[str, str]:
    """The markers from :func:`metax_markers` that identify MetaX on their own."""
    return {k: v for k, v in markers.items() if not k.startswith("env:")}


def cuda_driver_version() -> Optional[str]:
    """The CUDA driver API version (``cuDriverGetVersion``) as ``"12.4"``, or None.

    Read through ctypes from ``libcuda.so.1`` / ``nvcuda.dll``: torch does not expose it and
    calling ``nvidia-smi`` would spawn a process.
    """
    import ctypes

    names = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            v = ctypes.c_int(0)
            if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value:
                return f"{v.value // 1000}.{(v.value % 1000) // 10}"
        except (OSError, AttributeError):
            continue
    return None


def _matmul() -> Any:
    import torch

    return torch.backends.cuda.matmul


class CudaBackend(DeviceBackend):
    """NVIDIA GPUs through ``torch.cuda``."""

    name = "cuda"
    device_type = "cuda"
    description = "NVIDIA GPUs (torch.cuda): TF32/reduced-precision switches, cuBLAS/cuDNN determinism"
    vendor_module = None

    @dataclass
    class Options:
        """Numerics switches for a comparison run; ``None`` leaves the process's setting alone.

        Applied by :meth:`CudaBackend.apply_numerics` (the dump and compare engines call it when
        a run starts; users can call it themselves).
        """

        #: ``torch.backends.cuda.matmul.allow_tf32`` (TF32 in cuBLAS fp32 matmuls)
        allow_tf32: Optional[bool] = None
        #: ``torch.backends.cudnn.allow_tf32`` (TF32 in cuDNN fp32 convolutions); defaults to
        #: ``allow_tf32`` when that is set and this is not
        cudnn_allow_tf32: Optional[bool] = None
        #: ``torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction``
        allow_fp16_reduced_precision_reduction: Optional[bool] = None
        #: ``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction``
        allow_bf16_reduced_precision_reduction: Optional[bool] = None
        #: ``torch.backends.cudnn.deterministic``
        cudnn_deterministic: Optional[bool] = None
        #: ``torch.backends.cudnn.benchmark`` (autotuning picks kernels run to run)
        cudnn_benchmark: Optional[bool] = None
        #: ``CUBLAS_WORKSPACE_CONFIG`` (":4096:8" makes cuBLAS deterministic; read at cuBLAS init)
        cublas_workspace_config: Optional[str] = None
        #: ``torch.set_float32_matmul_precision``: "highest", "high" or "medium"
        float32_matmul_precision: Optional[str] = None

    def configure(self, options: Mapping[str, Any] | None = None) -> None:
        super().configure(options)
        opts = self.options
        for f in fields(opts):
            v = getattr(opts, f.name)
            if v is None:
                continue
            if f.name in ("cublas_workspace_config", "float32_matmul_precision"):
                if not isinstance(v, str):
                    raise UsageError(f"backend '{self.name}': option {f.name} must be a string, got {v!r}")
            elif not isinstance(v, bool):
                raise UsageError(f"backend '{self.name}': option {f.name} must be true, false or null, got {v!r}")
        if opts.float32_matmul_precision not in (None, "highest", "high", "medium"):
            raise UsageError(
                f"backend '{self.name}': float32_matmul_precision must be highest, high or medium, "
                f"got {opts.float32_matmul_precision!r}"
            )

    # ---- discovery -----------------------------------------------------------------------
    def is_available(self) -> Availability:
        try:
            import torch

            if getattr(torch.version, "hip", None):
                return Availability(False, "this torch is a ROCm build (torch.version.hip is set); AMD GPUs are not an NVIDIA CUDA device")
            if not torch.backends.cuda.is_built() or torch.version.cuda is None:
                return Availability(False, f"torch {torch.__version__} was built without CUDA; install a CUDA build of torch")
            strong = strong_metax_markers(metax_markers(probe_device=False))
            if strong:
                return Availability(False, f"this is MetaX MACA's torch ({_fmt(strong)}); use the 'maca' backend")
            if not torch.cuda.is_available():
                return Availability(False, "no CUDA device visible (torch.cuda.is_available() is False: no GPU, driver or CUDA_VISIBLE_DEVICES)")
            strong = strong_metax_markers(metax_markers(probe_device=True))
            if strong:
                return Availability(False, f"the visible GPU is a MetaX device ({_fmt(strong)}); use the 'maca' backend")
        except Exception as exc:  # a broken driver must not break discovery
            return Availability(False, f"probing CUDA failed: {type(exc).__name__}: {exc}")
        return Availability(True)

    # ---- reproducibility -------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        import torch

        torch.manual_seed(seed)  # seeds every CUDA device too (lazily when CUDA is not initialised)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed)

    def get_rng_state(self) -> dict[str, torch.Tensor]:
        """CPU generator state plus one entry per visible GPU (``"cuda:0"``, ``"cuda:1"`` ...),
        read with ``torch.cuda.get_rng_state_all``; restored by the base class."""
        import torch

        state = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            for i, s in enumerate(torch.cuda.get_rng_state_all()):
                state[f"{self.device_type}:{i}"] = s
        return state

    def set_deterministic(self, enabled: bool = True) -> None:
        """Deterministic algorithms, cuDNN deterministic and no benchmark, deterministic cuBLAS.

        ``CUBLAS_WORKSPACE_CONFIG`` is read when cuBLAS initialises: call this before the first
        matmul on the device, or set the variable before starting Python.
        """
        import torch

        if enabled:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", DETERMINISTIC_CUBLAS_WORKSPACE)
        torch.use_deterministic_algorithms(enabled, warn_only=True)
        torch.backends.cudnn.deterministic = enabled
        if enabled:
            torch.backends.cudnn.benchmark = False

    # ---- numerics ----------------------------------------------------------------------------
    def numerics_switches(self) -> dict[str, Any]:
        import torch

        m = _matmul()
        sw = {
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            # the base class's torch.get_float32_matmul_precision() raises on torch >= 2.9 once
            # the legacy and the new TF32 APIs were mixed; never let that break a dump header
            "float32_matmul_precision": _float32_matmul_precision(),
        }
        sw.update(
            allow_tf32=bool(m.allow_tf32),
            cudnn_allow_tf32=bool(torch.backends.cudnn.allow_tf32),
            allow_fp16_reduced_precision_reduction=bool(m.allow_fp16_reduced_precision_reduction),
            allow_bf16_reduced_precision_reduction=bool(getattr(m, "allow_bf16_reduced_precision_reduction", True)),
            cudnn_enabled=bool(torch.backends.cudnn.enabled),
            cudnn_deterministic=bool(torch.backends.cudnn.deterministic),
            cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
            cublas_workspace_config=os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        )
        blas = getattr(torch.backends.cuda, "preferred_blas_library", None)  # torch >= 2.3
        if blas is not None:
            try:
                sw["preferred_blas_library"] = str(blas()).split(".")[-1]
            except Exception:
                pass
        fp32p = _safe_getattr(m, "fp32_precision")  # torch >= 2.9 new TF32 API
        if fp32p is not None:
            sw["matmul_fp32_precision"] = str(fp32p)
        return sw

    def apply_numerics(self, options: Any = None) -> dict[str, Any]:
        """Set the switches named in ``options`` (default: the configured :class:`Options`).

        Fields left ``None`` are not touched. Returns the previous values of what was changed
        (keyword arguments for :meth:`apply_numerics`'s ``options``), so a caller can restore
        them: ``prev = b.apply_numerics(); ...; b.apply_numerics(prev)``.
        """
        import torch

        opts = self.options if options is None else options
        want = {f.name: getattr(opts, f.name) for f in fields(opts)} if not isinstance(opts, Mapping) else dict(opts)
        if want.get("allow_tf32") is not None and want.get("cudnn_allow_tf32") is None:
            want["cudnn_allow_tf32"] = want["allow_tf32"]
        m = _matmul()
        targets: dict[str, tuple[Any, str]] = {
            "allow_tf32": (m, "allow_tf32"),
            "cudnn_allow_tf32": (torch.backends.cudnn, "allow_tf32"),
            "allow_fp16_reduced_precision_reduction": (m, "allow_fp16_reduced_precision_reduction"),
            "allow_bf16_reduced_precision_reduction": (m, "allow_bf16_reduced_precision_reduction"),
            "cudnn_deterministic": (torch.backends.cudnn, "deterministic"),
            "cudnn_benchmark": (torch.backends.cudnn, "benchmark"),
        }
        prev: dict[str, Any] = {"_fp32_precision": _fp32_precision_snapshot()}
        # read every previous value before changing anything: the switches are linked (allow_tf32
        # changes what get_float32_matmul_precision() answers)
        before_precision = _float32_matmul_precision()
        for key, value in want.items():
            if value is None:
                continue
            if key == "_fp32_precision":
                continue  # restored last, below
            if key in targets:
                obj, attr = targets[key]
                if not hasattr(obj, attr):
                    continue  # older torch without the switch (bf16 RPR before 2.1)
                prev[key] = bool(getattr(obj, attr))
                setattr(obj, attr, bool(value))
            elif key == "cublas_workspace_config":
                prev[key] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
                os.environ["CUBLAS_WORKSPACE_CONFIG"] = str(value)
            elif key == "float32_matmul_precision":
                prev[key] = before_precision
                if value != "unknown":
                    torch.set_float32_matmul_precision(str(value))
            else:
                raise UsageError(f"backend '{self.name}': unknown numerics switch {key!r}")
        if want.get("_fp32_precision"):
            _fp32_precision_restore(want["_fp32_precision"])
        if len(prev) == 1:
            prev.pop("_fp32_precision")
        return prev

    @contextmanager
    def numerics(self, **overrides: Any) -> Iterator[dict[str, Any]]:
        """Context manager: apply ``overrides`` (Options field names), restore on exit.

        On torch >= 2.9 the legacy TF32 flags and the new ``fp32_precision`` settings are
        linked (setting ``allow_tf32`` back to False turns "none" into "ieee"), so those are
        snapshotted and restored as well.
        """
        prev = self.apply_numerics(overrides)
        try:
            yield self.numerics_switches()
        finally:
            restore = {k: v for k, v in prev.items() if k != "cublas_workspace_config"}
            self.apply_numerics(restore)
            if "cublas_workspace_config" in prev:
                if prev["cublas_workspace_config"] is None:
                    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
                else:
                    os.environ["CUBLAS_WORKSPACE_CONFIG"] = prev["cublas_workspace_config"]

    # ---- header ------------------------------------------------------------------------------
    def environment(self) -> dict[str, Any]:
        import torch

        env = super().environment()
        env.update(
            vendor="NVIDIA",
            cuda_runtime_version=torch.version.cuda,
            cudnn_version=_safe(torch.backends.cudnn.version),
            driver_version=cuda_driver_version(),
            device_count=0,
        )
        if torch.cuda.is_available():
            env["device_count"] = torch.cuda.device_count()
            idx = torch.cuda.current_device()
            props = torch.cuda.get_device_properties(idx)
            env["device_name"] = props.name
            env["compute_capability"] = f"{props.major}.{props.minor}"
            env["device_memory_bytes"] = int(props.total_memory)
            nccl = _safe(lambda: torch.cuda.nccl.version())
            env["nccl_version"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
        return env


#: torch >= 2.9: objects under torch.backends with an ``fp32_precision`` setting (the new TF32 API)
_FP32_PRECISION_PATHS = ("", "cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn", "mkldnn", "mkldnn.matmul",
                         "mkldnn.conv", "mkldnn.rnn")


def _fp32_precision_objects() -> list[tuple[str, Any]]:
    import torch

    found = []
    for path in _FP32_PRECISION_PATHS:
        obj: Any = torch.backends
        for part in filter(None, path.split(".")):
            obj = _safe_getattr(obj, part)
        if obj is not None and _safe_getattr(obj, "fp32_precision") is not None:
            found.append((path, obj))
    return found


def _safe_getattr(obj: Any, name: str) -> Any:
    """getattr(obj, name, None) for torch.backends objects, whose __getattr__ on torch < 2.9
    raises AssertionError ("Unknown attribute") rather than AttributeError."""
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def _fp32_precision_snapshot() -> dict[str, str]:
    """Every ``fp32_precision`` setting (empty before torch 2.9). Setting a legacy TF32 flag
    rewrites these, so restoring the legacy flags alone does not restore the process state."""
    return {path: str(obj.fp32_precision) for path, obj in _fp32_precision_objects()}


def _fp32_precision_restore(snapshot: Mapping[str, str]) -> None:
    for path, obj in _fp32_precision_objects():  # generic first, then the specific ones
        if path in snapshot:
            try:
                obj.fp32_precision = snapshot[path]
            except Exception:  # pragma: no cover - a value this build rejects
                pass


def _float32_matmul_precision() -> str:
    """``torch.get_float32_matmul_precision()``, or "unknown" when torch refuses to answer
    (torch >= 2.9 raises after legacy and new TF32 APIs were mixed)."""
    import torch

    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        return "unknown"


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:
        return None


def _fmt(markers: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in markers.items())


@hookimpl
def torchparity_backends():
    yield CudaBackend()
