"""Plugin discovery and the registry of enabled components.

Flow: entry points of group ``torchparity`` are listed, filtered by ``plugins.yaml``, imported one
by one (a failing import is reported and skipped, the rest keeps working), registered with pluggy,
validated (``check_pending``), and then asked for their components through the registration hooks.
Components are keyed by ``(kind, name)``; a name claimed twice is reported and the first claim
(in sorted plugin order) wins. Finally ``plugins.yaml`` orders, configures and enables them.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Iterable

import pluggy

from . import hookspecs
from .config import ComponentSpec, PluginsConfig, load_config
from .errors import PluginError, UsageError
from .plugin_types import Checker, Configurable, DeviceBackend, Reporter

log = logging.getLogger("torchparity")

GROUP = hookspecs.PROJECT_NAME
KINDS = {"backend": DeviceBackend, "checker": Checker, "reporter": Reporter}
HOOK_FOR_KIND = {
    "backend": "torchparity_backends",
    "checker": "torchparity_checkers",
    "reporter": "torchparity_reporters",
}


@dataclass
class PluginInfo:
    """One plugin (a registered module or object), for ``torchparity plugins``."""

    name: str  # entry-point name (= module name for built-ins)
    dist: str | None = None
    version: str | None = None
    status: str = "loaded"  # loaded | disabled | import-failed | invalid
    detail: str = ""


@dataclass
class ComponentInfo:
    kind: str
    name: str
    component: Configurable
    plugin: str
    dist: str | None
    version: str | None
    enabled: bool = True
    why_disabled: str = ""


@dataclass
class Registry:
    """The enabled components, in configured order, plus what went wrong on the way."""

    config: PluginsConfig
    pm: pluggy.PluginManager
    plugins: list[PluginInfo] = field(default_factory=list)
    components: list[ComponentInfo] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def _enabled(self, kind: str) -> dict[str, Any]:
        return {c.name: c.component for c in self.components if c.kind == kind and c.enabled}

    @property
    def backends(self) -> dict[str, DeviceBackend]:
        return self._enabled("backend")

    @property
    def checkers(self) -> dict[str, Checker]:
        return self._enabled("checker")

    @property
    def reporters(self) -> dict[str, Reporter]:
        return self._enabled("reporter")

    def get(self, kind: str, name: str) -> Any:
        """The enabled component ``name`` of ``kind``, or a clear error naming what exists."""
        for c in self.components:
            if c.kind == kind and c.name == name:
                if not c.enabled:
                    raise PluginError(f"{kind} '{name}' is disabled ({c.why_disabled}); enable it in {self.config.path or 'plugins.yaml'}")
                return c.component
        known = sorted(c.name for c in self.components if c.kind == kind)
        hint = f"installed: {', '.join(known)}" if known else f"no {kind} plugins are installed"
        raise PluginError(f"no {kind} named '{name}' ({hint}); install its plugin (pip install ./{kind}s/{name}) or fix the name")

    def backend(self, name: str) -> DeviceBackend:
        return self.get("backend", name)

    def checkers_for(self, scope: str) -> list[Checker]:
        return [c for c in self.checkers.values() if scope in c.scopes]


def _dist_of(ep: md.EntryPoint) -> tuple[str | None, str | None]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    try:
        return dist.metadata["Name"], dist.version
    except Exception:  # pragma: no cover - broken metadata
        return None, None


def iter_entry_points() -> list[md.EntryPoint]:
    eps = md.entry_points()
    selected = eps.select(group=GROUP) if hasattr(eps, "select") else eps.get(GROUP, [])  # py<3.10
    unique: dict[tuple[str, str], md.EntryPoint] = {}
    for ep in selected:
        unique.setdefault((ep.name, ep.value), ep)
    return sorted(unique.values(), key=lambda e: e.name)


def build_registry(
    config: PluginsConfig | None = None,
    *,
    autoload: bool = True,
    extra_plugins: Iterable[tuple[str, object]] = (),
) -> Registry:
    """Discover plugins and build the registry. Never raises for a single broken plugin."""
    config = config if config is not None else load_config()
    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(hookspecs)
    reg = Registry(config=config, pm=pm)
    by_name: dict[str, PluginInfo] = {}

    def add_plugin(name: str, obj: object, dist: str | None, version: str | None) -> None:
        if pm.has_plugin(name) or name in by_name and by_name[name].status == "loaded":
            reg.problems.append(
                f"plugin '{name}' is provided twice ({by_name[name].dist} and {dist}); uninstall one of them"
            )
            return
        try:
            pm.register(obj, name=name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            info = PluginInfo(name, dist, version, "invalid", str(exc))
            reg.plugins.append(info)
            by_name[name] = info
            reg.problems.append(f"plugin '{name}' ({dist or 'not packaged'}) is invalid: {exc}; fix or disable it in plugins.yaml")
            return
        info = PluginInfo(name, dist, version)
        reg.plugins.append(info)
        by_name[name] = info

    if autoload:
        for ep in iter_entry_points():
            dist, version = _dist_of(ep)
            if config.is_disabled(ep.name, dist, ep.value):
                info = PluginInfo(ep.name, dist, version, "disabled", "disabled in plugins.yaml")
                reg.plugins.append(info)
                by_name[ep.name] = info
                continue
            try:
                obj = ep.load()
            except Exception as exc:
                info = PluginInfo(ep.name, dist, version, "import-failed", f"{type(exc).__name__}: {exc}")
                reg.plugins.append(info)
                by_name[ep.name] = info
                reg.problems.append(
                    f"plugin '{ep.name}' ({dist}) failed to import ({type(exc).__name__}: {exc}); "
                    f"reinstall it or add it to plugins.disable in plugins.yaml"
                )
                continue
            add_plugin(ep.name, obj, dist, version)

    for modname in config.modules:
        if config.is_disabled(modname):
            continue
        try:
            mod: ModuleType = importlib.import_module(modname)
        except Exception as exc:
            reg.problems.append(f"plugin module '{modname}' from plugins.yaml failed to import ({type(exc).__name__}: {exc}); fix plugins.modules")
            continue
        add_plugin(modname, mod, None, None)

    for name, obj in extra_plugins:
        add_plugin(name, obj, None, None)

    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        bad = pm.get_name(exc.plugin) if getattr(exc, "plugin", None) is not None else None
        reg.problems.append(f"plugin '{bad}' implements an unknown hook ({exc}); check the hook name against torchparity.hookspecs")
        if bad:
            pm.unregister(name=bad)
            by_name[bad].status = "invalid"
            by_name[bad].detail = str(exc)

    _collect_components(reg, by_name)
    _apply_config(reg)
    _check_names(reg, extra_names=[n for n, _ in extra_plugins])
    return reg


def _collect_components(reg: Registry, by_name: dict[str, PluginInfo]) -> None:
    seen: dict[tuple[str, str], ComponentInfo] = {}
    for kind, hook_name in HOOK_FOR_KIND.items():
        hook = getattr(reg.pm.hook, hook_name)
        impls = sorted(hook.get_hookimpls(), key=lambda i: i.plugin_name)
        for impl in impls:
            info = by_name.get(impl.plugin_name, PluginInfo(impl.plugin_name))
            try:
                produced = impl.function() or ()
                items = list(produced)
            except Exception as exc:
                reg.problems.append(f"plugin '{impl.plugin_name}' failed in {hook_name}() ({type(exc).__name__}: {exc}); disable it in plugins.yaml or report it to its author")
                continue
            for obj in items:
                if not isinstance(obj, KINDS[kind]) or not getattr(obj, "name", ""):
                    reg.problems.append(
                        f"plugin '{impl.plugin_name}' returned {obj!r} from {hook_name}(); expected a named {KINDS[kind].__name__}"
                    )
                    continue
                key = (kind, obj.name)
                if key in seen:
                    reg.problems.append(
                        f"{kind} '{obj.name}' is provided by both '{seen[key].plugin}' and '{impl.plugin_name}'; "
                        f"using '{seen[key].plugin}'. Disable one of them in plugins.yaml (plugins.disable)"
                    )
                    continue
                ci = ComponentInfo(kind, obj.name, obj, impl.plugin_name, info.dist, info.version)
                seen[key] = ci
                reg.components.append(ci)


def _apply_config(reg: Registry) -> None:
    cfg = reg.config
    for ci in reg.components:
        if cfg.is_disabled(ci.name, ci.plugin, ci.dist):
            ci.enabled, ci.why_disabled = False, "disabled in plugins.yaml"
    # options and order
    ordered: list[ComponentInfo] = []
    listed: dict[str, dict[str, ComponentSpec]] = {
        "checker": {s.name: s for s in cfg.checkers},
        "reporter": {s.name: s for s in cfg.reporters},
    }
    for kind, specs in listed.items():
        names = {c.name for c in reg.components if c.kind == kind}
        for spec in specs.values():
            if spec.name not in names:
                reg.problems.append(
                    f"plugins.yaml names {kind} '{spec.name}' but no installed plugin provides it; "
                    f"install it or remove it from plugins.yaml"
                )
    for ci in reg.components:
        spec = listed.get(ci.kind, {}).get(ci.name)
        options: dict[str, Any] = {}
        if ci.kind == "backend":
            options = cfg.backend_options.get(ci.name, {})
        elif spec is not None:
            options = spec.options
            if not spec.enabled:
                ci.enabled, ci.why_disabled = False, "enabled: false in plugins.yaml"
        try:
            ci.component.configure(options)
        except (PluginError, UsageError, TypeError, ValueError) as exc:
            ci.enabled, ci.why_disabled = False, f"bad options: {exc}"
            reg.problems.append(str(exc))

    def order_key(ci: ComponentInfo) -> tuple[int, int, str]:
        kind_order = list(KINDS).index(ci.kind)
        names = list(listed.get(ci.kind, {}))
        pos = names.index(ci.name) if ci.name in names else len(names)
        return (kind_order, pos, ci.name)

    ordered = sorted(reg.components, key=order_key)
    reg.components[:] = ordered


def _plural_list(names: Iterable[str]) -> str:
    names = sorted(set(names))
    return ", ".join(names) if names else "(none)"


def _check_names(reg: Registry, extra_names: Iterable[str] = ()) -> None:
    """Warn (one line each, in ``reg.problems``) about names in plugins.yaml that match nothing
    installed: ``plugins.disable``/``plugins.enable`` entries, ``backends.reference``/``target``
    and ``backends.options`` keys. Nothing is disabled or enabled because of these warnings; a
    command that actually needs the named backend fails with its own error."""
    cfg = reg.config
    where = f"{cfg.path}" if cfg.path else "plugins.yaml"
    plugin_names = {p.name for p in reg.plugins} | set(cfg.modules) | set(extra_names)
    dists = {p.dist for p in reg.plugins if p.dist}
    component_names = {c.name for c in reg.components}
    values = {getattr(ep, "value", "") for ep in iter_entry_points()} if reg.plugins else set()
    known = plugin_names | dists | component_names | values
    for key, names in (("disable", cfg.disable), ("enable", cfg.enable)):
        for name in names:
            if name not in known:
                reg.problems.append(
                    f"{where}: plugins.{key} names '{name}', which no installed plugin or component has "
                    f"(components: {_plural_list(component_names)}; plugins: {_plural_list(plugin_names)}); "
                    f"fix the name or remove it"
                )

    backends = {c.name for c in reg.components if c.kind == "backend"}
    # components of a plugin disabled in plugins.yaml were never loaded: do not call them unknown
    # (built-in plugins are named torchparity_backend_<name>)
    off = [p.name for p in reg.plugins if p.status != "loaded"]

    def unknown_backend(name: str) -> bool:
        return name not in backends and not any(p == name or p.endswith("_" + name) for p in off)

    installed = f"installed backends: {_plural_list(backends)}"
    for key, name in (("reference", cfg.reference_backend), ("target", cfg.target_backend)):
        if name is not None and unknown_backend(str(name)):
            reg.problems.append(
                f"{where}: backends.{key} names backend '{name}', which is not installed ({installed}); "
                f"commands that need the {key} backend will fail until you fix the name or install its plugin"
            )
    for name in cfg.backend_options:
        if unknown_backend(name):
            reg.problems.append(
                f"{where}: backends.options has options for backend '{name}', which is not installed "
                f"({installed}); they are ignored. Install its plugin or remove them"
            )


_CACHE: dict[Any, Registry] = {}


def get_registry(config_path: str | None = None, *, reload: bool = False) -> Registry:
    """The process-wide registry for a plugins.yaml (cached). Problems are logged once."""
    cfg = load_config(config_path)
    key = str(cfg.path)
    if reload or key not in _CACHE:
        reg = build_registry(cfg)
        for p in reg.problems:
            log.warning(p)
        _CACHE[key] = reg
    return _CACHE[key]


def clear_cache() -> None:
    _CACHE.clear()


_WARNED: set[str] = set()


def op_consumers(options: Any, registry: Registry | None = None) -> list[Any]:
    """The op-stream consumers the installed plugins supply for a dump with ``options``
    (:func:`~torchparity.hookspecs.torchparity_op_consumers`). A plugin that raises, or returns
    something else than an :class:`~torchparity.capture.op_stream.OpConsumer`, is warned about
    once and left out."""
    reg = registry if registry is not None else get_registry()
    hook = reg.pm.hook.torchparity_op_consumers
    impls = hook.get_hookimpls()
    if not impls:
        return []
    from .capture.op_stream import OpConsumer

    out: list[Any] = []
    for impl in sorted(impls, key=lambda i: i.plugin_name):
        try:
            kwargs = {a: options for a in impl.argnames if a == "options"}
            produced = list(impl.function(**kwargs) or ())
        except Exception as exc:
            _warn_once(f"plugin '{impl.plugin_name}' failed in torchparity_op_consumers() ({type(exc).__name__}: "
                       f"{exc}); its consumers are left out of this dump; disable it in plugins.yaml or report it "
                       "to its author")
            continue
        for obj in produced:
            if isinstance(obj, OpConsumer):
                out.append(obj)
            else:
                _warn_once(f"plugin '{impl.plugin_name}' returned {type(obj).__name__} from "
                           "torchparity_op_consumers(); expected torchparity.OpConsumer instances (left out)")
    return out


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        log.warning(msg)
