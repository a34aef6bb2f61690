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


def test_projecting_a_layout_imports_no_torch(tmp_path):
    """The model needs no tensors: simulate and compare of a layout run without loading torch."""
    store = str(tmp_path / "r.sqlite")
    scenario = ("--layout", "resnet50", "--device", "a100", "--nodes", "4", "--bandwidth", "10Gbit", "--store", store)
    modules = _imported("simulate", *scenario, "--compressor", "sidco-e", "--density", "0.01")
    assert "torch" not in modules and "scipy.optimize" not in modules  # the compute fit is read, not solved
    modules = _imported("compare", *scenario, "--compressors", "topk,dgc,sidco-e,redsync", "--densities", "0.01")
    assert "torch" not in modules and "pipeline.verdict" in modules
    modules = _imported("sweep", *scenario, "--compressors", "none,topk", "--densities", "0.01", "--jobs", "1",
                        "--no-progress")
    assert "torch" not in modules and "convergence.tta" in modules
    on_this_cpu = [a if a != "a100" else "cpu" for a in scenario]  # the host's identity is read, not torch's
    modules = _imported("simulate", *on_this_cpu, "--compressor", "sidco-e", "--density", "0.01")
    assert "torch" not in modules and "costs.devices" in modules
    assert "compressors.kernels.native" not in modules and not {m for m in modules if m.split(".")[0] == "measuring"}


def test_pricing_on_this_cpu_never_compiles_or_measures():
    """The cost model prices SIDCo's native path on a CPU by asking whether the kernels are built
    (compressors.kernels.native_build.built): compressors.kernels.native, whose library() compiles, is never
    imported, nor the measuring lab, nor torch."""
    code = ("import sys\nfrom costs import costmodel, devices\n"
            "profile = costmodel.compression_profile(devices.get('cpu'), [('sidco-e', 0.01), ('topk', 0.01)])\n"
            "assert profile.cost('sidco-e', 0.01).compress_s(1 << 20) > 0\n"
            "print('\\n'.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    modules = set(done.stdout.split())
    assert "compressors.kernels.native_build" in modules and "compressors.kernels.native" not in modules
    assert "torch" not in modules and not {m for m in modules if m.split(".")[0] == "measuring"}


def test_the_registry_names_each_compressors_class_and_message():
    import compressors
    from compressors.work import REGISTRY

    for card in REGISTRY:
        cls = compressors.compressor_class(card.name)
        assert cls.name == card.name and cls.message == compressors.message_kind(card.name) == card.message
    assert compressors.names() == [card.name for card in REGISTRY]


def test_shipped_layouts_are_the_measured_ones():
    from traces import layout_models, layouts

    for name, tokens in layout_models.shipped_keys():
        assert layouts.layout(name, tokens) == layout_models.measure(name, tokens), (name, tokens)


def test_dashboard_help_and_the_manual_name_every_page():
    """`sidco dashboard --help` and docs/usage.md list the pages the app serves."""
    from pathlib import Path

    from dashboard.app import PAGES

    text = subprocess.run([sys.executable, "-m", "sidco", "dashboard", "--help"], capture_output=True, text=True).stdout
    text = " ".join(text.split())
    manual = (Path(__file__).parents[1] / "docs" / "usage.md").read_text()
    words = {6: "six"}
    assert f"dashboard's {words[len(PAGES)]} pages" in text and f"serves {words[len(PAGES)]} pages" in manual
    for page in PAGES:
        assert page.TITLE in text, page.TITLE
        assert f"**{page.TITLE}** (`{page.PATH}`)" in manual, page.TITLE


def test_emulate_help_and_the_manual_agree_on_repeats():
    from pathlib import Path

    text = subprocess.run([sys.executable, "-m", "sidco", "emulate", "--help"], capture_output=True,
                          text=True).stdout
    manual = (Path(__file__).parents[1] / "docs" / "usage.md").read_text()
    assert "their mean reported" in " ".join(text.split())
    assert "the mean over `--repeats` is stored" in manual and "the median over `--repeats`" not in manual
