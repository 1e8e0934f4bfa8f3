"""``plugins.yaml``: which plugins are enabled, in what order, with what options.

Lookup order for the file: an explicit path (``--plugins FILE`` / ``config=``), then the
``TORCHPARITY_PLUGINS`` environment variable, then ``./plugins.yaml`` in the working directory,
then the ``plugins.yaml`` at the root of the torchparity source tree (editable installs), then
built-in defaults (every installed plugin enabled, no options).

Schema (version 1)::

    version: 1
    plugins:
      disable: [maca]          # entry-point, distribution or component names never loaded/used
      enable: []               # if non-empty: only these plugins/components are used
      modules: []              # extra importable modules registered as plugins (no packaging)
    backends:
      reference: cpu           # backend used as reference by online compare
      options: {cpu: {}}       # per-backend options
    checkers:                  # order = order of evaluation; each item "name" or {name: options}
      - allclose: {}
      - md5
    reporters: [log, json, xlsx, advisor]

A component missing from the ``checkers``/``reporters`` lists is still enabled (after the listed
ones) unless ``plugins.disable`` names it; ``{name: {enabled: false}}`` disables one in place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UsageError

ENV_VAR = "TORCHPARITY_PLUGINS"
KNOWN_TOP_KEYS = {"version", "plugins", "backends", "checkers", "reporters"}
KNOWN_PLUGIN_KEYS = {"disable", "enable", "modules"}
KNOWN_BACKEND_KEYS = {"reference", "target", "options"}


@dataclass
class ComponentSpec:
    name: str
    enabled: bool = True
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class PluginsConfig:
    """Parsed ``plugins.yaml``."""

    path: Path | None = None
    disable: list[str] = field(default_factory=list)
    enable: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    reference_backend: str = "cpu"
    target_backend: str | None = None
    backend_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    checkers: list[ComponentSpec] = field(default_factory=list)
    reporters: list[ComponentSpec] = field(default_factory=list)

    def is_disabled(self, *names: str | None) -> bool:
        wanted = {n for n in names if n}
        if any(n in self.disable for n in wanted):
            return True
        if self.enable and not any(n in self.enable for n in wanted):
            return True
        return False


def source_tree_config() -> Path | None:
    """The plugins.yaml at the root of the source tree, when torchparity runs from a checkout."""
    candidate = Path(__file__).resolve().parents[2] / "plugins.yaml"
    return candidate if candidate.is_file() else None


def find_config(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise UsageError(f"plugins file {p} does not exist; pass an existing YAML file or omit --plugins")
        return p
    env = os.environ.get(ENV_VAR)
    if env:
        p = Path(env)
        if not p.is_file():
            raise UsageError(f"{ENV_VAR}={env} does not point to a file; fix or unset the variable")
        return p
    local = Path.cwd() / "plugins.yaml"
    if local.is_file():
        return local
    return source_tree_config()


def _names(raw: Any, where: str, path: Path | None) -> list[str]:
    """A list of names (``disable: [maca]``); a single name is accepted as a list of one."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list) or not all(isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in raw):
        raise UsageError(f"{path}: '{where}' must be a list of names, not {_shown(raw)}; write e.g. {where.split('.')[-1]}: [maca]")
    return [str(x) for x in raw]


def _mapping(raw: Any, where: str, path: Path | None) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: '{where}' must be a mapping (key: value lines), not {_shown(raw)}")
    return raw


def _shown(v: Any) -> str:
    s = repr(v)
    return f"{type(v).__name__} {s if len(s) <= 40 else s[:37] + '...'}"


def _component_list(raw: Any, section: str, path: Path | None) -> list[ComponentSpec]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise UsageError(f"{path}: '{section}' must be a list of names or {{name: options}} items, not {_shown(raw)}")
    specs: list[ComponentSpec] = []
    for item in raw:
        if isinstance(item, str):
            specs.append(ComponentSpec(item))
        elif isinstance(item, dict) and len(item) == 1:
            (name, opts), = item.items()
            if opts is not None and not isinstance(opts, dict):
                raise UsageError(f"{path}: options of {section} '{name}' must be a mapping, not {_shown(opts)}")
            opts = dict(opts or {})
            enabled = opts.pop("enabled", True)
            if not isinstance(enabled, bool):
                raise UsageError(f"{path}: '{section}.{name}.enabled' must be true or false, not {_shown(enabled)}")
            specs.append(ComponentSpec(str(name), enabled, opts))
        else:
            raise UsageError(f"{path}: bad item in '{section}': {_shown(item)}; write 'name' or 'name: {{options}}'")
    return specs


def parse_config(data: Any, path: Path | None = None) -> PluginsConfig:
    """Check and parse the YAML value of a plugins.yaml; any wrong type is a one-line
    :class:`~torchparity.errors.UsageError` naming the file and the key."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping at the top level of plugins.yaml, not {_shown(data)}")
    unknown = set(map(str, data)) - KNOWN_TOP_KEYS
    if unknown:
        raise UsageError(
            f"{path}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(KNOWN_TOP_KEYS))}"
        )
    version = data.get("version", 1)
    if version != 1 or isinstance(version, bool):
        raise UsageError(f"{path}: plugins.yaml version {version!r:.40} is not supported (this torchparity reads version 1)")
    plugins = _mapping(data.get("plugins"), "plugins", path)
    if set(map(str, plugins)) - KNOWN_PLUGIN_KEYS:
        raise UsageError(f"{path}: unknown key(s) under 'plugins': {', '.join(sorted(set(map(str, plugins)) - KNOWN_PLUGIN_KEYS))}")
    backends = _mapping(data.get("backends"), "backends", path)
    if set(map(str, backends)) - KNOWN_BACKEND_KEYS:
        raise UsageError(f"{path}: unknown key(s) under 'backends': {', '.join(sorted(set(map(str, backends)) - KNOWN_BACKEND_KEYS))}")
    for key in ("reference", "target"):
        v = backends.get(key)
        if v is not None and not isinstance(v, str):
            raise UsageError(f"{path}: 'backends.{key}' must be a backend name, not {_shown(v)}")
    options = _mapping(backends.get("options"), "backends.options", path)
    return PluginsConfig(
        path=path,
        disable=_names(plugins.get("disable"), "plugins.disable", path),
        enable=_names(plugins.get("enable"), "plugins.enable", path),
        modules=_names(plugins.get("modules"), "plugins.modules", path),
        reference_backend=str(backends.get("reference") or "cpu"),
        target_backend=backends.get("target"),
        backend_options={str(k): dict(_mapping(v, f"backends.options.{k}", path)) for k, v in options.items()},
        checkers=_component_list(data.get("checkers"), "checkers", path),
        reporters=_component_list(data.get("reporters"), "reporters", path),
    )


def load_config(explicit: str | os.PathLike[str] | None = None) -> PluginsConfig:
    """Find and parse plugins.yaml (see the module docstring for the lookup order)."""
    import yaml

    path = find_config(explicit)
    if path is None:
        return PluginsConfig()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise UsageError(" ".join(f"{path} is not valid YAML: {exc}".split())) from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not a text file (not UTF-8); plugins.yaml must be YAML text - "
                         f"fix or replace it") from None
    except (OSError, RecursionError) as exc:
        raise UsageError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None
    return parse_config(data, path)
