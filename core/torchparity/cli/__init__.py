"""The ``torchparity`` command line (click).

Sub-commands live in their own modules and are imported only when used, so ``torchparity
--help`` and ``torchparity plugins`` start without importing torch. Exit codes: 0 ok,
1 findings (a divergence or an overflow was found), 2 usage or input error.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from typing import Any

import click

from .. import __version__
from ..errors import TorchparityError

# command name -> (module, attribute, one-line help shown in the listing)
COMMANDS: dict[str, tuple[str, str]] = {
    "plugins": ("torchparity.cli.plugins_cmd", "plugins"),
    "run": ("torchparity.cli.run_cmd", "run"),
    "compare": ("torchparity.cli.compare_cmd", "compare"),
    "overflow": ("torchparity.cli.overflow_cmd", "overflow"),
    "replay": ("torchparity.cli.replay_cmd", "replay"),
    "demo": ("torchparity.cli.demo_cmd", "demo"),
    "grads": ("torchparity.cli.grads_cmd", "grads"),
    "graph": ("torchparity.cli.graph_cmd", "graph"),
    "info": ("torchparity.cli.info_cmd", "info"),
    "compact": ("torchparity.cli.compact_cmd", "compact"),
    "query": ("torchparity.cli.query_cmd", "query"),
    "replicas": ("torchparity.cli.replicas_cmd", "replicas"),
    "bisect": ("torchparity.cli.bisect_cmd", "bisect"),
}

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2
#: True when main() set TORCH_DEVICE_BACKEND_AUTOLOAD=0 itself (not the user).
AUTOLOAD_FORCED = False


class LazyGroup(click.Group):
    """A group whose sub-commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = set(self.commands)
        for name, (module, _) in COMMANDS.items():
            if importlib.util.find_spec(module) is not None:
                names.add(name)
        return sorted(names)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.commands:
            return self.commands[name]
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name]
        if importlib.util.find_spec(module) is None:
            return None
        cmd = getattr(importlib.import_module(module), attr)
        self.add_command(cmd, name)
        return cmd


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "-V", "--version", prog_name="torchparity")
@click.option(
    "--plugins",
    "plugins_file",
    type=click.Path(dir_okay=False),
    envvar="TORCHPARITY_PLUGINS",
    default=None,
    help="plugins.yaml to use (default: ./plugins.yaml, else the one beside the installed source). "
    "Also read from $TORCHPARITY_PLUGINS.",
)
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.pass_context
def cli(ctx: click.Context, plugins_file: str | None, verbose: int) -> None:
    """Find where a PyTorch model's numerics diverge between devices.

    \b
    Typical workflow:
      torchparity run -o dumps/npu -- python train.py      # dump on the device
      torchparity run -o dumps/cpu -- python train.py      # dump the benchmark
      torchparity compare dumps/npu dumps/cpu -o out       # name the first diverging op

    Exit codes: 0 ok, 1 divergence/overflow found, 2 usage or input error.
    """
    logging.basicConfig(
        level=logging.WARNING - 10 * min(verbose, 2),
        format="torchparity: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    ctx.ensure_object(dict)
    ctx.obj["plugins_file"] = plugins_file


def registry_from(ctx: click.Context, reload: bool = False) -> Any:
    """The plugin registry for the CLI's --plugins option."""
    from ..plugins import get_registry

    root = ctx.find_root()
    path = (root.obj or {}).get("plugins_file")
    return get_registry(path, reload=reload)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: turn TorchparityError into one line and exit code 2."""
    # The offline commands need no device: never let a vendor extension autoload at `import torch`.
    global AUTOLOAD_FORCED
    if "TORCH_DEVICE_BACKEND_AUTOLOAD" not in os.environ:
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        AUTOLOAD_FORCED = True  # `torchparity run` removes it again for the user's script
    try:
        rv = cli.main(args=argv, prog_name="torchparity", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(EXIT_USAGE)
    except click.ClickException as exc:  # one line, like every other error (no usage block)
        msg = " ".join(exc.format_message().split())
        ctx = getattr(exc, "ctx", None)
        if isinstance(exc, click.UsageError) and ctx is not None:
            msg += f" (see '{ctx.command_path} --help')"
        click.echo(f"torchparity: error: {msg}", err=True)
        sys.exit(EXIT_USAGE if exc.exit_code == 2 or exc.exit_code == 1 else exc.exit_code)
    except TorchparityError as exc:
        click.echo(f"torchparity: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("torchparity: interrupted", err=True)
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else EXIT_OK)
