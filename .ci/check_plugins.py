"""Fail CI when any installed torchparity plugin's entry point does not load or register."""

import sys

from torchparity.plugins import build_registry, iter_entry_points
from torchparity.config import PluginsConfig

reg = build_registry(PluginsConfig())
bad = [p for p in reg.plugins if p.status != "loaded"]
for p in reg.plugins:
    print(f"{p.status:14} {p.name} ({p.dist} {p.version}) {p.detail}")
for problem in reg.problems:
    print(f"problem: {problem}")
names = [ep.name for ep in iter_entry_points()]
if bad or reg.problems or not names:
    print("plugin check FAILED", file=sys.stderr)
    sys.exit(1)
print(f"plugin check ok: {len(names)} entry points, {len(reg.components)} components")
