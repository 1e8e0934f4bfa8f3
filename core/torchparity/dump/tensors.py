"""Lazy handles of saved tensors: safetensors (torchparity) and msprobe ``.pt`` files.

Nothing is read before ``load()``; nothing is ever unpickled (``.pt`` files are read with
``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from ..errors import DumpError

# ----------------------------------------------------------------------------------------------
# lazy tensor handles
# ----------------------------------------------------------------------------------------------


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (torch.load's refusals run to a dozen lines)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    s = lines[0] if lines else ""
    return s if len(s) <= limit else s[:limit - 3] + "..."


class TensorRef:
    """A lazy reference to one saved tensor. ``load()`` reads it; nothing is read before."""

    __slots__ = ("path", "key")

    def __init__(self, path: Path, key: str | None) -> None:
        self.path = path
        self.key = key

    def exists(self) -> bool:
        return self.path.is_file()

    def load(self) -> Any:
        """Return the tensor (a ``torch.Tensor``). Raises :class:`DumpError` when unreadable."""
        if not self.path.is_file():
            raise DumpError(
                f"tensor file {self.path} is missing; the dump is incomplete (copied partially or "
                f"the process died) - re-run the dump, or compare in statistics mode"
            )
        try:
            return self._read()
        except DumpError:
            raise
        except Exception as exc:  # corrupt file, missing key, unsupported content
            raise DumpError(
                f"tensor '{self.key}' in {self.path} cannot be read ({type(exc).__name__}: {first_line(exc)}); "
                f"the file is corrupt - re-run the dump, or compare in statistics mode"
            ) from None

    def _read(self) -> Any:
        from safetensors import safe_open

        with safe_open(str(self.path), framework="pt") as f:
            return f.get_tensor(self.key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, {self.key!r})"


class TensorLoader:
    """Loads many :class:`TensorRef` s, opening each safetensors file once (a small LRU of open
    files). Use as a context manager; ``load(ref)`` raises :class:`DumpError` like ``ref.load()``."""

    def __init__(self, max_open: int = 16) -> None:
        self.max_open = max_open
        self._open: dict[Path, Any] = {}

    def load(self, ref: TensorRef) -> Any:
        if type(ref) is not TensorRef:  # msprobe .pt files and other kinds: one file per tensor
            return ref.load()
        f = self._open.get(ref.path)
        if f is None:
            if not ref.path.is_file():
                return ref.load()  # the missing-file message
            try:
                from safetensors import safe_open

                f = safe_open(str(ref.path), framework="pt")
            except Exception:
                return ref.load()  # the corrupt-file message
            if len(self._open) >= self.max_open:
                self._open.pop(next(iter(self._open)))
            self._open[ref.path] = f
        try:
            return f.get_tensor(ref.key)
        except Exception as exc:
            raise DumpError(
                f"tensor '{ref.key}' in {ref.path} cannot be read ({type(exc).__name__}: {first_line(exc)}); "
                f"the file is corrupt - re-run the dump, or compare in statistics mode"
            ) from None

    def close(self) -> None:
        self._open.clear()

    def __enter__(self) -> "TensorLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class PtRef(TensorRef):
    """An msprobe ``.pt`` tensor, read with ``torch.load(weights_only=True)`` (never unpickled)."""

    def _read(self) -> Any:
        import torch

        try:
            obj = torch.load(str(self.path), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise DumpError(
                f"{self.path} holds pickled Python objects, not only a tensor; torchparity never unpickles "
                f"them (it loads .pt files with weights_only=True) - re-save the tensor alone, or compare "
                f"in statistics mode"
            ) from None
        if not isinstance(obj, torch.Tensor):
            raise DumpError(f"{self.path} does not hold a tensor but a {type(obj).__name__}")
        return obj
