"""The front door starts fast: `sidco --help` lists every command without importing torch."""

from __future__ import annotations

import subprocess
import sys

from sidco.commands import COMMANDS


def _imported(*argv: str) -> set[str]:
    code = ("import sys; from sidco.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('\\n'.join(sorted(sys.modules)), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    return set(done.stderr.split())


def test_help_lists_every_command_and_imports_no_torch():
    modules = _imported("--help")
    assert "torch" not in modules and not any(m.startswith("sidco.commands.") for m in modules)
    out = subprocess.run([sys.executable, "-m", "sidco", "--help"], capture_output=True, text=True).stdout
    for name, summary in COMMANDS.items():
        assert name in out and summary.split()[0] in out


def test_a_subcommand_registers_its_own_module_only():
    modules = _imported("dashboard", "--help")
    assert "sidco.commands.dashboard" in modules and "sidco.commands.simulate" not in modules
    assert "torch" not in modules


def test_every_module_takes_its_summary_from_the_table():
    from sidco.cli import build_parser
    import argparse

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {c.dest: c.help for c in sub._choices_actions}
    assert helps == COMMANDS
