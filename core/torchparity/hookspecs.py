"""Hook specifications: the contract between torchparity's core and its plugins.

A plugin is a module (usually the top-level module of its own distribution) that implements some
of the hooks below with :data:`torchparity.hookimpl` and is announced through an entry point in
the ``torchparity`` group::

    # pyproject.toml of the plugin
    [project.entry-points.torchparity]
    torchparity_backend_foo = "torchparity_backend_foo"

Registration hooks return (or yield) plain objects: a :class:`~torchparity.plugin_types.DeviceBackend`,
a :class:`~torchparity.plugin_types.Checker` or a :class:`~torchparity.plugin_types.Reporter`;
:func:`torchparity_op_consumers` is called per dump and returns consumers of the op stream.
Core flattens the results, rejects duplicate names, and lets ``plugins.yaml`` choose which of them
are enabled, in what order, with what options. Hooks are always called with keyword arguments, and
an implementation may accept any subset of a hook's arguments, so arguments can be added later
without breaking plugins.

Plugins must not import torch, pandas or vendor SDKs at module import time: discovery has to stay
fast and must work on a machine without the vendor stack. Import them inside methods.

Versioning: :data:`HOOK_API_VERSION` is bumped only when a hook is removed or its contract changes
incompatibly. Adding a hook or an argument does not bump it. A plugin can check it with
``torchparity.HOOK_API_VERSION``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import pluggy

if TYPE_CHECKING:  # pragma: no cover - typing only
    import click

    from .capture.op_stream import OpConsumer
    from .capture.options import DumpOptions
    from .plugin_types import Checker, DeviceBackend, Reporter

PROJECT_NAME = "torchparity"
HOOK_API_VERSION = 1

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def torchparity_backends() -> Iterable[DeviceBackend]:
    """Register device backends.

    Called once, when the plugin manager is built (at the first use of any backend, of the CLI's
    ``plugins`` command, or of a dump/compare that needs the device's environment).

    :returns: an iterable of :class:`~torchparity.plugin_types.DeviceBackend` instances. Each has
        a unique ``name`` (the key used in ``plugins.yaml`` and on the command line, e.g. ``"npu"``)
        and a ``device_type`` (the torch device string, e.g. ``"npu"``; MetaX MACA reports
        ``"cuda"``). Constructing a backend must be cheap and must not import the vendor SDK;
        ``is_available()`` is where the SDK is probed.

    Example::

        @hookimpl
        def torchparity_backends():
            yield FooBackend()

    .. versionadded:: 0.1
    """


@hookspec
def torchparity_checkers() -> Iterable[Checker]:
    """Register checkers: the judges that turn metrics into pass / warning / error verdicts.

    Called once, when the plugin manager is built.

    :returns: an iterable of :class:`~torchparity.plugin_types.Checker` instances with unique
        ``name`` s (``"allclose"``, ``"md5"``, ``"overflow"``...). A checker says in ``scopes``
        where it applies: ``"compare"`` (offline rows of a comparison, vectorised over a
        DataFrame), ``"online"`` (one device/reference tensor pair while the model runs) and/or
        ``"dump"`` (a single dump, no benchmark: e.g. overflow classification).

    Example::

        @hookimpl
        def torchparity_checkers():
            yield AllcloseChecker()

    .. versionadded:: 0.1
    """


@hookspec
def torchparity_reporters() -> Iterable[Reporter]:
    """Register reporters: writers of comparison results (log, json, xlsx, advisor text...).

    Called once, when the plugin manager is built.

    :returns: an iterable of :class:`~torchparity.plugin_types.Reporter` instances with unique
        ``name`` s. The name is what users pass to ``torchparity compare --format``.

    Example::

        @hookimpl
        def torchparity_reporters():
            yield JsonReporter()

    .. versionadded:: 0.1
    """


@hookspec
def torchparity_register_commands(cli: click.Group) -> None:
    """Add sub-commands to the ``torchparity`` command line.

    Called once when the CLI starts, after the built-in commands are defined. Use it for
    capability-specific or vendor-specific commands (e.g. ``torchparity npu-info``).

    :param cli: the root :class:`click.Group`; call ``cli.add_command(...)`` or decorate with
        ``@cli.command()``. Do not replace built-in commands.

    .. versionadded:: 0.1
    """


@hookspec
def torchparity_op_consumers(options: DumpOptions) -> Iterable[OpConsumer]:
    """Hang consumers of your own on the op stream while a dump runs.

    The op stream (:func:`torchparity.op_stream`, see docs/op-stream.md) intercepts every aten op
    of the model once and hands it to a chain of :class:`torchparity.OpConsumer` s: the dump's
    own capture, the NaN/Inf screen, online compare, the emulated device, and yours.

    Called at the start of every dump (``torchparity.dump(...)`` entered, ``Dumper.start()``,
    ``torchparity dump`` on the command line), at any level, after the dump's own capture is
    set up. Each returned consumer is attached to the stream (with the dump's ``model``, when it
    was given, so that ``call.where()`` names modules by their path in it) for as long as the
    dump runs, and detached, in reverse order, when it stops; its ``on_op(call, args, kwargs,
    run)`` then sees every op the model runs, with the dump's record name (``call.name``,
    ``Aten.mm.3.forward``), phase and, with ``needs_modules = True``, module.

    A consumer must return ``run(*args, **kwargs)`` (or, at ``layer = LAYER_DEVICE``, compute
    the result itself) and never change its arguments in place: observers at
    ``LAYER_OBSERVER`` keep the model's numerics bitwise unchanged. An exception raised by
    ``on_op`` propagates to the model's code, as the op's own would.

    :param options: the dump's :class:`~torchparity.capture.options.DumpOptions` (``path``,
        ``level``, ``mode``, ``steps``...); read it, never change it.
    :returns: an iterable of :class:`~torchparity.OpConsumer` instances (return nothing, or an
        empty list, to stay out of this dump). A plugin that raises here, or returns something
        else than an ``OpConsumer``, is reported once as a warning and left out; the dump runs.

    Example::

        class OpCounter(torchparity.OpConsumer):
            needs_modules = True

            def __init__(self):
                self.seen = []

            def on_op(self, call, args, kwargs, run):
                out = run(*args, **kwargs)
                if call.name is not None:
                    self.seen.append((call.name, call.module))
                return out

        @hookimpl
        def torchparity_op_consumers(options):
            if options.level == "aten":
                yield OpCounter()

    .. versionadded:: 0.2
    """
