"""Capture inside ``torch.compile`` graphs: a compile backend that instruments the AOTAutograd
forward and backward graphs with in-graph statistics (docs/compile.md)."""

from .backend import CompileCapture, compile_backend

__all__ = ["CompileCapture", "compile_backend"]
