"""Write docs/cli.md from the CLI's own --help texts (run after changing any --help).

    python .ci/gen_cli_docs.py          # rewrite docs/cli.md
    python .ci/gen_cli_docs.py --check  # exit 1 if docs/cli.md is out of date (used by the tests)
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"

HEADER = """# CLI reference

Generated from `torchparity --help` and each sub-command's `--help` by `.ci/gen_cli_docs.py`
(a test fails when this page and the `--help` texts disagree).

Exit codes, for every command: **0** ok, **1** findings (a divergence, an overflow, a failing
replay), **2** usage or input error (one line on stderr saying what is wrong and what to do).
"""


def render() -> str:
    from torchparity.cli import cli

    parts = [HEADER]
    # the CLI's own context settings (``-h`` as well as ``--help``); sub-command contexts inherit them
    settings = {k: v for k, v in (cli.context_settings or {}).items() if k not in ("terminal_width", "max_content_width")}
    ctx = click.Context(cli, info_name="torchparity", terminal_width=100, max_content_width=100, **settings)
    parts.append("## torchparity\n\n```\n" + cli.get_help(ctx) + "\n```\n")
    for name in cli.list_commands(ctx):
        cmd = cli.get_command(ctx, name)
        if cmd is None:
            continue
        sub = click.Context(cmd, info_name=name, parent=ctx, terminal_width=100, max_content_width=100)
        parts.append(f"## torchparity {name}\n\n```\n" + cmd.get_help(sub) + "\n```\n")
    return "\n".join(parts)


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is out of date: run python .ci/gen_cli_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
