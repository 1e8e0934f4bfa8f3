"""torchparity backend for Huawei Ascend NPUs through ``torch_npu`` (device ``npu``).

What it adds to the generic backend:

* discovery that never imports ``torch_npu`` (only ``find_spec``), refuses when another vendor
  already renamed PrivateUse1 in this process, and turns a broken CANN install into a reason;
* the header: SoC name, ``torch_npu`` and CANN versions, and the **overflow mode**: on Ascend,
  fp16 (and fp32) overflow either produces Inf/NaN (``inf_nan`` mode, default on Atlas A2/A3) or
  clamps to the dtype's largest finite value (``saturation`` mode, Atlas training series and
  whenever ``INF_NAN_MODE_ENABLE=0``). The overflow checker reads it: in saturation mode a value at
  the dtype's max counts as overflow for every float dtype, so "overflow" means the same as on a GPU;
* the custom ops: ``op_namespaces = ("npu",)`` makes the aten-level capture record
  ``torch.ops.npu.*`` kernels, and :meth:`NpuBackend.custom_api_functions` lists the Python-level
  ``torch_npu.npu_*`` functions (fusion attention, rms_norm, rotary_mul, swiglu ...) for the
  api-level capture;
* ``allow_hf32`` switches of matmul/conv (Ascend's TF32 analogue), deterministic mode including
  ``HCCL_DETERMINISTIC`` for collectives, and dtypes some chips cannot compute (``upcast_dtypes``).

Vendor calls relied on (mimicked by ``tests/backends/fakes``): ``torch_npu.__version__``;
``torch_npu.utils.get_cann_version()`` or ``torch_npu.utils.collect_env.get_cann_version()``
(optional; else ``ascend_toolkit_install.info`` under ``$ASCEND_TOOLKIT_HOME``/``$ASCEND_HOME_PATH``);
``torch_npu.npu.utils.is_support_inf_nan()`` (optional; else ``$INF_NAN_MODE_ENABLE``);
``torch.npu.is_available``, ``device_count``, ``current_device``, ``get_device_name``,
``synchronize``, ``manual_seed_all``, ``get_rng_state``, ``set_rng_state``;
``torch.npu.matmul.allow_hf32`` and ``torch.npu.conv.allow_hf32`` (optional).
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional

from torchparity import hookimpl
from torchparity.errors import UsageError
from torchparity.plugin_types import DEFAULT_COLLECTIVE_OPS, Availability, DeviceBackend

if TYPE_CHECKING:  # pragma: no cover
    import torch

__version__ = "0.1.0"

#: torch_npu's Python-level fused ops worth recording at api level (those present are used).
NPU_CUSTOM_APIS = (
    "npu_fusion_attention", "npu_fusion_attention_grad", "npu_incre_flash_attention",
    "npu_prompt_flash_attention", "npu_fused_infer_attention_score", "npu_rms_norm",
    "npu_add_rms_norm", "npu_rotary_mul", "npu_apply_rotary_pos_emb", "npu_swiglu",
    "npu_geglu", "npu_gelu", "npu_fast_gelu", "npu_silu", "npu_mish", "npu_layer_norm_eval",
    "npu_scaled_masked_softmax", "npu_dropout_with_add_softmax", "npu_confusion_transpose",
    "npu_bmmV2", "npu_linear", "npu_grouped_matmul", "npu_moe_gating_top_k_softmax",
    "npu_moe_init_routing", "npu_moe_finalize_routing", "npu_quant_matmul",
    "npu_weight_quant_batchmatmul", "npu_dynamic_quant", "npu_format_cast",
)

#: SoC name prefixes of chips without bfloat16 arithmetic (first-generation Ascend 910 and
#: the Ascend 310 inference series). Atlas A2 (Ascend910B*) and A3 (Ascend910_93*) have it.
NO_BF16_SOCS = ("Ascend910A", "Ascend910ProA", "Ascend910PremiumA", "Ascend910ProB", "Ascend310")

#: torch_npu's fused compute + communication ops (matmul with all-gather / reduce-scatter /
#: all-reduce): recorded like collectives and never re-executed by online compare or replay.
NPU_COLLECTIVE_OPS = frozenset({"npu_all_gather_base_mm", "npu_mm_reduce_scatter_base", "npu_mm_all_reduce_base"})

OVERFLOW_INF_NAN = "inf_nan"
OVERFLOW_SATURATION = "saturation"


def privateuse1_owner() -> Optional[str]:
    """Name of PrivateUse1 in this process if torch is imported and it was renamed, else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        name = torch._C._get_privateuse1_backend_name()
    except Exception:  # pragma: no cover - private API moved
        return None
    return None if name == "privateuseone" else name

def privateuse1_environment() -> dict[str, Any]:
    """For the dump header: what PrivateUse1 is called in this process and whether vendor
    extensions were allowed to autoload at ``import torch`` (``TORCH_DEVICE_BACKEND_AUTOLOAD``,
    torch >= 2.5; unset means on). Two dumps that differ here were not produced the same way."""
    return {
        "privateuse1_backend": privateuse1_owner() or "privateuseone",
        "torch_device_backend_autoload": os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1"),
    }


def read_cann_version_file(env: Mapping[str, str] | None = None) -> Optional[str]:
    """The CANN toolkit version from ``ascend_toolkit_install.info`` (``version=8.0.RC2``)."""
    env = os.environ if env is None else env
    homes = [env.get("ASCEND_TOOLKIT_HOME"), env.get("ASCEND_HOME_PATH"), "/usr/local/Ascend/ascend-toolkit/latest"]
    for home in homes:
        if not home:
            continue
        for info in sorted(glob.glob(os.path.join(home, "*", "ascend_toolkit_install.info"))) + [
            os.path.join(home, "ascend_toolkit_install.info")
        ]:
            try:
                with open(info, encoding="utf-8") as fh:
                    for line in fh:
                        if line.strip().startswith("version="):
                            return line.split("=", 1)[1].strip().strip('"')
            except OSError:
                continue
    return None


class NpuBackend(DeviceBackend):
    """Huawei Ascend NPUs through ``torch_npu``."""

    name = "npu"
    device_type = "npu"
    vendor_module = "torch_npu"
    description = "Huawei Ascend NPUs via torch_npu (device npu; npu_* custom ops; saturation/INF_NAN overflow mode)"
    op_namespaces = ("npu",)
    collective_ops = DEFAULT_COLLECTIVE_OPS | NPU_COLLECTIVE_OPS

    @dataclass
    class Options:
        """Switches for a comparison run (``None`` leaves them alone) and dtype handling."""

        #: ``torch.npu.matmul.allow_hf32`` (HF32 in fp32 matmul, Ascend's TF32 analogue)
        allow_hf32_matmul: Optional[bool] = None
        #: ``torch.npu.conv.allow_hf32`` (HF32 in fp32 convolution)
        allow_hf32_conv: Optional[bool] = None
        #: dtypes to compute in another dtype, e.g. ``{float64: float32}``; merged over the
        #: automatic choice (bfloat16 -> float32 on chips without bf16)
        upcast: Dict[str, str] = field(default_factory=dict)

    def __init__(self) -> None:
        super().__init__()
        self.upcast_dtypes: Dict[str, str] = {}

    def configure(self, options: Mapping[str, Any] | None = None) -> None:
        super().configure(options)
        for key in ("allow_hf32_matmul", "allow_hf32_conv"):
            if getattr(self.options, key) not in (None, True, False):
                raise UsageError(f"backend 'npu': {key} must be true, false or null, got {getattr(self.options, key)!r}")
        if not isinstance(self.options.upcast, dict):
            raise UsageError("backend 'npu': upcast must be a mapping like {float64: float32}")
        self.upcast_dtypes = dict(self.options.upcast)

    # ---- discovery -----------------------------------------------------------------------
    def is_available(self) -> Availability:
        try:
            if "torch_npu" not in sys.modules and importlib.util.find_spec("torch_npu") is None:
                return Availability(False, "Python module 'torch_npu' is not installed (Ascend CANN/torch_npu missing)")
            owner = privateuse1_owner()
            if owner is not None and owner != self.device_type:
                return Availability(
                    False,
                    f"PrivateUse1 is already '{owner}' in this process and can be renamed only once; "
                    "run npu in its own process (dump per device, compare offline)",
                )
            import torch

            importlib.import_module("torch_npu")
            mod = getattr(torch, "npu", None)
            if mod is None or not hasattr(mod, "is_available"):
                return Availability(False, "'torch_npu' imported but torch.npu is missing")
            if not mod.is_available():
                return Availability(False, "torch_npu is installed but no NPU is visible (driver, ASCEND_RT_VISIBLE_DEVICES?)")
        except Exception as exc:
            msg = str(exc).splitlines()[0] if str(exc) else ""
            return Availability(False, f"importing torch_npu failed (is CANN's set_env.sh sourced?): {type(exc).__name__}: {msg}")
        self._refresh_upcast()
        return Availability(True)

    def _soc_name(self) -> Optional[str]:
        import torch

        mod = getattr(torch, "npu", None)
        try:
            if mod is not None and mod.is_available():
                return str(mod.get_device_name(mod.current_device()))
        except Exception:
            return None
        return None

    def _refresh_upcast(self) -> None:
        auto: Dict[str, str] = {}
        soc = self._soc_name() or ""
        if soc.startswith(NO_BF16_SOCS) and not soc.startswith("Ascend910B"):
            auto["bfloat16"] = "float32"
        self.upcast_dtypes = {**auto, **self.options.upcast}

    # ---- overflow mode ---------------------------------------------------------------------
    def overflow_mode(self) -> str:
        """``"inf_nan"`` or ``"saturation"``: what fp overflow produces on this NPU.

        Asks ``torch_npu.npu.utils.is_support_inf_nan()`` when torch_npu is loaded; otherwise
        (offline, or an old torch_npu without it) falls back to ``$INF_NAN_MODE_ENABLE`` and
        then to ``inf_nan``, the default on current chips.
        """
        tn = sys.modules.get("torch_npu")
        probe = getattr(getattr(getattr(tn, "npu", None), "utils", None), "is_support_inf_nan", None)
        if probe is not None:
            try:
                return OVERFLOW_INF_NAN if probe() else OVERFLOW_SATURATION
            except Exception:
                pass
        if os.environ.get("INF_NAN_MODE_FORCE_DISABLE") == "1":
            return OVERFLOW_SATURATION
        flag = os.environ.get("INF_NAN_MODE_ENABLE")
        if flag is not None:
            return OVERFLOW_SATURATION if flag.strip() == "0" else OVERFLOW_INF_NAN
        return OVERFLOW_INF_NAN

    # ---- custom ops --------------------------------------------------------------------------
    def custom_api_functions(self) -> dict[str, Any]:
        """``{"torch_npu.npu_rms_norm": fn, ...}``: torch_npu's fused Python APIs present here,
        for the api-level capture to wrap. Empty when torch_npu is not loaded."""
        tn = sys.modules.get("torch_npu")
        if tn is None:
            return {}
        found = {}
        for attr in sorted(set(NPU_CUSTOM_APIS) | {a for a in dir(tn) if a.startswith("npu_")}):
            fn = getattr(tn, attr, None)
            if callable(fn):
                found[f"torch_npu.{attr}"] = fn
        return found

    # ---- reproducibility -------------------------------------------------------------------
    def set_deterministic(self, enabled: bool = True) -> None:
        """Deterministic kernels (torch_npu honours ``use_deterministic_algorithms``) and
        deterministic HCCL reductions (``HCCL_DETERMINISTIC``, read when HCCL initialises)."""
        import torch

        torch.use_deterministic_algorithms(enabled, warn_only=True)
        if enabled:
            os.environ.setdefault("HCCL_DETERMINISTIC", "true")
        elif os.environ.get("HCCL_DETERMINISTIC") == "true":
            os.environ.pop("HCCL_DETERMINISTIC")

    # ---- numerics ----------------------------------------------------------------------------
    def _hf32_targets(self) -> dict[str, Any]:
        import torch

        mod = getattr(torch, "npu", None)
        return {
            "allow_hf32_matmul": getattr(mod, "matmul", None),
            "allow_hf32_conv": getattr(mod, "conv", None),
        }

    def numerics_switches(self) -> dict[str, Any]:
        sw = super().numerics_switches()
        for key, obj in self._hf32_targets().items():
            if obj is not None and hasattr(obj, "allow_hf32"):
                sw[key] = bool(obj.allow_hf32)
        sw["overflow_mode"] = self.overflow_mode()
        sw["hccl_deterministic"] = os.environ.get("HCCL_DETERMINISTIC")
        if self.upcast_dtypes:
            sw["upcast"] = dict(self.upcast_dtypes)
        return sw

    def apply_numerics(self, options: Any = None) -> dict[str, Any]:
        """Set ``allow_hf32_*`` from the configured (or given) options; returns previous values."""
        opts = self.options if options is None else options
        want = dict(opts) if isinstance(opts, Mapping) else {
            "allow_hf32_matmul": opts.allow_hf32_matmul, "allow_hf32_conv": opts.allow_hf32_conv}
        prev: dict[str, Any] = {}
        targets = self._hf32_targets()
        for key in ("allow_hf32_matmul", "allow_hf32_conv"):
            value = want.get(key)
            if value is None:
                continue
            obj = targets[key]
            if obj is None or not hasattr(obj, "allow_hf32"):
                raise UsageError(f"backend 'npu': this torch_npu has no {key.replace('allow_hf32_', 'torch.npu.')}.allow_hf32 switch")
            prev[key] = bool(obj.allow_hf32)
            obj.allow_hf32 = bool(value)
        return prev

    # ---- header ------------------------------------------------------------------------------
    def cann_version(self) -> Optional[str]:
        """CANN version from torch_npu when loaded, else from the toolkit's install info file."""
        tn = sys.modules.get("torch_npu")
        utils = getattr(tn, "utils", None)
        for getter in (getattr(utils, "get_cann_version", None),
                       getattr(getattr(utils, "collect_env", None), "get_cann_version", None)):
            if getter is not None:
                try:
                    v = getter()
                    if v:
                        return str(v)
                except Exception:
                    continue
        return read_cann_version_file()

    def environment(self) -> dict[str, Any]:
        env = super().environment()
        tn = sys.modules.get("torch_npu")
        env.update(
            vendor="Huawei",
            torch_npu_version=getattr(tn, "__version__", None),
            cann_version=self.cann_version(),
            overflow_mode=self.overflow_mode(),
            **privateuse1_environment(),
        )
        import torch

        mod = getattr(torch, "npu", None)
        try:
            if mod is not None and mod.is_available():
                env["device_count"] = mod.device_count()
                env["device_name"] = mod.get_device_name(mod.current_device())
        except Exception:
            pass
        if self.upcast_dtypes:
            env["upcast_dtypes"] = dict(self.upcast_dtypes)
        return env


@hookimpl
def torchparity_backends():
    yield NpuBackend()
