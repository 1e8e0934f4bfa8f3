"""Check that the declared dependency bounds and CI's lower-bound pins agree, and show versions.

    python .ci/check_bounds.py              # bounds vs .ci/constraints-lowest.txt (no install needed)
    python .ci/check_bounds.py --versions   # ... and print the installed version of each dependency
    python .ci/check_bounds.py --lowest     # ... and fail unless each one is installed at its pin

Every third-party dependency named in a pyproject.toml (dependencies, optional extras, build-system) or in
requirements.txt must have one pin ``name==version`` in the constraints file, and that pin must
satisfy every specifier given for the name and lie in the release series of the lower bound
(``numpy>=1.23`` allows ``numpy==1.23.2``, not ``1.24.0``): the "lowest" job then really tests the
oldest versions we claim to support. The exact ``torch==`` pin of requirements.txt is what the
"newest" job uses and is left out of this check (the lowest job drops it).
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # a bare venv: pip always carries a copy
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]
    from pip._vendor.packaging.version import Version  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / ".ci" / "constraints-lowest.txt"
OWN_PREFIX = "torchparity"


@dataclass
class Declared:
    """Every specifier given for one dependency, and where."""

    name: str
    specs: list[tuple[str, str]] = field(default_factory=list)  # (specifier text, source file)


def _pyprojects() -> list[Path]:
    found = [ROOT / "pyproject.toml"]
    for group in ("backends", "checkers", "reporters"):
        found += sorted((ROOT / group).glob("*/pyproject.toml"))
    return found


def declared() -> dict[str, Declared]:
    """Third-party dependencies of every distribution in the repository, plus requirements.txt's."""
    out: dict[str, Declared] = {}

    def add(text: str, source: str) -> None:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name.startswith(OWN_PREFIX):
            return
        out.setdefault(name, Declared(name)).specs.append((str(req.specifier), source))

    for path in _pyprojects():
        project = tomllib.loads(path.read_text())["project"]
        rel = str(path.relative_to(ROOT))
        for dep in project.get("dependencies", []):
            add(dep, rel)
        for extra, deps in project.get("optional-dependencies", {}).items():
            for dep in deps:
                add(dep, f"{rel} [{extra}]")
        for dep in tomllib.loads(path.read_text()).get("build-system", {}).get("requires", []):
            add(dep, f"{rel} [build-system]")
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        if re.match(r"^torch\s*==", line):  # the newest job's exact torch; the lowest job drops it
            continue
        if re.match(r"^(transformers|triton)\b", line):  # newest job only (real models; Triton's interpreter):
            continue  # the lowest job drops them
        add(line, "requirements.txt")
    return out


def pins() -> dict[str, Version]:
    """``name==version`` lines of the constraints file."""
    out: dict[str, Version] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*==\s*([0-9][0-9A-Za-z.+\-]*)", line)
        if not m:
            raise SystemExit(f"{CONSTRAINTS}: '{line}' is not a 'name==version' pin; write one pin a line")
        out[canonicalize_name(m.group(1))] = Version(m.group(2))
    return out


def problems(decl: dict[str, Declared], pinned: dict[str, Version]) -> list[str]:
    """Disagreements between the declared bounds and the pins, one sentence each."""
    errs: list[str] = []
    for name, d in sorted(decl.items()):
        where = ", ".join(sorted({src for _, src in d.specs}))
        pin = pinned.get(name)
        if pin is None:
            errs.append(f"{name} ({where}) has no pin in {CONSTRAINTS.name}: add '{name}==<its lower bound>'")
            continue
        lows = []
        for spec_text, src in d.specs:
            req = Requirement(f"{name}{spec_text}")
            if not req.specifier.contains(pin, prereleases=True):
                errs.append(f"{name}=={pin} in {CONSTRAINTS.name} does not satisfy '{spec_text}' of {src}")
            lows += [Version(s.version) for s in req.specifier if s.operator in (">=", "~=", "==")]
        if not lows:
            errs.append(f"{name} ({where}) has no lower bound: add '>=' the version the lowest job pins ({pin})")
            continue
        low = max(lows)
        if pin.release[: len(low.release)] != low.release:
            errs.append(f"{name}: the lower bound is {low} but {CONSTRAINTS.name} pins {pin}: "
                        f"pin the oldest {low} release, or raise the bound to what is tested")
    for name in sorted(set(pinned) - set(decl)):
        errs.append(f"{name} is pinned in {CONSTRAINTS.name} but no pyproject.toml or requirements.txt needs it: remove the pin")
    return errs


def installed(names: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def main(argv: list[str]) -> int:
    decl, pinned = declared(), pins()
    errs = problems(decl, pinned)
    names = ["torch"] + sorted(n for n in decl if n != "torch")
    if "--versions" in argv or "--lowest" in argv:
        have = installed(names)
        print("versions: " + ", ".join(f"{n} {have[n] or 'MISSING'}" for n in names))
        if "--lowest" in argv:
            for n in names:
                want = pinned.get(n)
                if want is not None and (have[n] is None or Version(have[n]) != want):
                    errs.append(f"{n} is {have[n] or 'not installed'} in this environment, not the pinned {want}")
    for e in errs:
        print(f"check_bounds: {e}", file=sys.stderr)
    if errs:
        return 1
    print(f"check_bounds: ok, {len(decl)} dependencies, each pinned at its lower bound in {CONSTRAINTS.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
