"""The statistics kernels' PTX without a GPU: ``python bench/triton_ptx.py [--arch 90] [--out FILE]``.

Triton compiles to PTX on a machine without a GPU when it is given a target; this prints, for each
statistics kernel of ``capture/stat_triton.py`` (bfloat16 values), the kinds of global loads in its
PTX (``ld.global.v4.b32``: 16-byte vectorized loads; ``ld.global.b16``: one element per load) and its
instruction count, so that a change to a kernel can be checked for what it does to the loads before a
GPU is lent. ``--out`` writes the one-value kernel's PTX (to diff two code states).
"""

from __future__ import annotations

import argparse
import collections
import re
import warnings

from torchparity.capture import stat_triton as st


def _compile(fn, signature: dict, constexprs: dict, aligned: list[int], arch: int, warps: int):  # type: ignore[no-untyped-def]
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps}).asm["ptx"]


def _summary(ptx: str) -> str:
    loads = collections.Counter(re.findall(r"ld\.global[.\w]*", ptx))
    instr = sum(1 for line in ptx.splitlines() if re.match(r"\s+[a-z]", line) and not line.strip().startswith("."))
    return f"loads {dict(loads)}, {instr} instructions"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (default 90: H100/H200)")
    ap.add_argument("--out", default=None, help="write the one-value kernel's PTX (size divisible by 16) here")
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    if not st._load():
        print("Triton is not importable here")
        return 1
    import triton.language as tl

    one = {"x_ptr": "*bf16", "out_ptr": "*fp64", "n": "i32", "row0": "i32", "BLOCK": "constexpr"}
    for label, aligned in (("one value, size divisible by 16", [0, 1, 2]), ("one value, other sizes", [0, 1])):
        ptx = _compile(st._stats_partials, one, {"BLOCK": st.BLOCK}, aligned, a.arch, st.NUM_WARPS)
        print(f"{label}: {_summary(ptx)}")
        if a.out and aligned == [0, 1, 2]:
            with open(a.out, "w") as f:
                f.write(ptx)
    many = {"ptrs": "*i64", "tab": "*i64", "out_ptr": "*fp64", "row0": "i32", "BLOCK": "constexpr",
            "DTYPE": "constexpr", "ALIGNED": "constexpr"}
    for aligned in (True, False):
        ptx = _compile(st._stats_partials_multi, many, {"BLOCK": st.BLOCK, "DTYPE": tl.bfloat16, "ALIGNED": aligned},
                       [0, 1, 2], a.arch, st.NUM_WARPS)
        print(f"many values (address table), {'aligned' if aligned else 'any address or size'}: {_summary(ptx)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
