"""Structure rules, checked on the source: dependencies point one way, parsers refuse abbreviations."""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The house drawing (architecture/house.json) is the one home of these rules: each room (a top-level
# package) may import the rooms of its own and lower layers only, the doors only the rooms they list,
# and never a forbidden edge.
HOUSE = json.loads((ROOT / "architecture" / "house.json").read_text())
LAYERS = {room["package"]: room["layer"] for room in HOUSE["rooms"]}


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _imported_packages(path: Path) -> set[tuple[str, int]]:
    """Top-level project packages imported anywhere in ``path`` (module level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in LAYERS:
                found.add((top, node.lineno))
    return found


def _packages(folder: Path) -> set[str]:
    return {d.name for d in folder.iterdir() if (d / "__init__.py").is_file()}


def test_the_house_drawing_is_the_tree():
    """architecture/house.json names every top-level package and each room's sub-packages, and no other."""
    assert _packages(ROOT) - {"tests"} == set(LAYERS)
    for room in HOUSE["rooms"]:
        assert _packages(ROOT / room["package"]) == set(room.get("sub-packages", {})), room["package"]
    assert set(HOUSE["forbidden"]) <= set(LAYERS) and set(DOORS) <= set(LAYERS)


def house_table() -> list[str]:
    """README's package table as the house drawing writes it: one row a room, its sub-packages in its job."""
    rows = ["| package | job |", "|---|---|"]
    for room in HOUSE["rooms"]:
        subs = "".join(f"; `{name}/` {job}" for name, job in room.get("sub-packages", {}).items())
        rows.append(f"| `{room['package']}/` | {room['job']}{subs} |")
    return rows


def test_the_readme_package_table_is_the_house_drawing():
    """The README's package table is the drawing's rooms and jobs, in its order (print it with
    ``python -c "from tests.test_architecture import house_table; print(*house_table(), sep='\\n')"``)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("| package | job |")
    table = lines[start:start + len(house_table())]
    assert table == house_table()
    assert not lines[start + len(table)].startswith("|")


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_dependencies_point_one_way(package):
    wrong = []
    for path in _sources(package):
        for imported, line in _imported_packages(path):
            if LAYERS[imported] > LAYERS[package]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    assert not wrong, "\n".join(wrong)


# The front doors map input to the orchestration layer and print or plot its result: they import
# the pipeline, the store and the units only (the dashboard may be started by the command line).
DOORS = {door: set(rooms) for door, rooms in HOUSE["doors"].items()}
FORBIDDEN = {room: set(LAYERS) - {room} if rule["rooms"] == ["*"] else set(rule["rooms"])
             for room, rule in HOUSE["forbidden"].items()}


@pytest.mark.parametrize("door", sorted(DOORS))
def test_doors_import_only_the_pipeline_the_store_and_units(door):
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {imported}"
             for path in _sources(door) for imported, line in _imported_packages(path)
             if imported not in DOORS[door]]
    assert not wrong, "\n".join(sorted(wrong))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_forbidden_edges(package):
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {imported}"
             for path in _sources(package) for imported, line in _imported_packages(path)
             if imported in FORBIDDEN[package]]
    assert not wrong, "\n".join(sorted(wrong))


# The doors map input to a request; resolving it is the pipeline's: they never look a device up,
# build a workload source or compression costs themselves (pipeline.request, pipeline.project).
RESOLVING = {"devices", "costmodel", "resolve_device", "layout_source", "trace_source", "compression_profile",
             "CompressionProfile", "CostRequest", "Source", "Device"}


@pytest.mark.parametrize("door", sorted(DOORS))
def test_doors_neither_look_devices_up_nor_build_sources_or_costs(door):
    wrong = [f"{p.relative_to(ROOT)}:{n.lineno} uses {name}"
             for p in _sources(door) for n in ast.walk(ast.parse(p.read_text()))
             for name in [n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", None)]
             if isinstance(n, (ast.Attribute, ast.Name)) and name in RESOLVING]
    wrong += [f"{p.relative_to(ROOT)}:{n.lineno} imports {a.name}"
              for p in _sources(door) for n in ast.walk(ast.parse(p.read_text()))
              if isinstance(n, ast.ImportFrom) for a in n.names if a.name in RESOLVING]
    assert not wrong, "\n".join(sorted(wrong))


def test_no_relative_imports_hide_from_the_check():
    relative = [f"{p.relative_to(ROOT)}:{n.lineno}" for package in LAYERS for p in _sources(package)
                for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ImportFrom) and n.level > 0]
    assert not relative


def _parser_calls(path: Path) -> list[ast.Call]:
    calls = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "ArgumentParser":
                calls.append(node)
    return calls


def test_every_argument_parser_refuses_abbreviations():
    lax = []
    for package in [*LAYERS, "tools"]:
        for path in _sources(package):
            for call in _parser_calls(path):
                strict = any(k.arg == "allow_abbrev" and isinstance(k.value, ast.Constant) and k.value.value is False
                             for k in call.keywords)
                if not strict:
                    lax.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    assert not lax, "ArgumentParser without allow_abbrev=False: " + ", ".join(lax)


def test_every_sidco_subcommand_refuses_abbreviations(capsys):
    from sidco.cli import build_parser

    parser = build_parser()
    assert parser.allow_abbrev is False
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert sub.choices and all(p.allow_abbrev is False for p in sub.choices.values())
    # --device is not --device-flops: a one-line error about the flag the user typed
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["simulate", "--layout", "resnet50", "--nodes", "2", "--bandwidth", "1Gbit",
                           "--device-flop", "1e12"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --device-flop 1e12" in capsys.readouterr().err


@pytest.mark.parametrize("package", ["simulator", "costs"])
def test_the_cluster_model_measures_nothing(package):
    """Timing loops and measuring children live in measuring/; the model and the pricing of its
    costs only read their results."""
    clocks = ("perf_counter", "process_time", "monotonic", "subprocess", "synchronize")
    found = [f"{p.relative_to(ROOT)}:{n.lineno} {n.attr if isinstance(n, ast.Attribute) else n.id}"
             for p in _sources(package) for n in ast.walk(ast.parse(p.read_text()))
             if (isinstance(n, ast.Attribute) and n.attr in clocks) or (isinstance(n, ast.Name) and n.id in clocks)]
    imported = [f"{p.relative_to(ROOT)} imports subprocess" for p in _sources(package)
                if any(isinstance(n, ast.Import) and any(a.name == "subprocess" for a in n.names)
                       for n in ast.walk(ast.parse(p.read_text())))]
    assert not found + imported, "\n".join(found + imported)


def _modules_imported(path: Path) -> list[tuple[str, int]]:
    """Every module ``path`` imports (``from m import a`` counts ``m`` and ``m.a``), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.module, node.lineno)] + [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
    return found


def test_the_model_asks_the_costs_through_one_interface():
    """The cluster model takes costs as input through the top of costs/ (its ``__all__``: compression
    costs, compute from FLOPs and bandwidth), as a simulator asks a compute back end for a kernel's
    time; it never reaches into a cost module (devices, the cost model, profiles, throughput)."""
    import costs

    wrong = []
    for path in _sources("simulator"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "costs" for a in node.names):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} imports a costs module")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "costs":
                asked = {a.name for a in node.names}
                if node.module != "costs" or not asked <= set(costs.__all__):
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} from {node.module} import {sorted(asked)}")
    assert not wrong, "\n".join(wrong)
    interface = {n.module for n in ast.walk(ast.parse((ROOT / "costs" / "__init__.py").read_text()))
                 if isinstance(n, (ast.Import, ast.ImportFrom))}
    assert interface == {"__future__", "costs.compute", "costs.profile"}, "the interface imports no cost builder"


NO_COMPILER = ("compressors.kernels.native", "measuring", "subprocess", "multiprocessing", "ctypes")


def test_pricing_never_compiles_or_measures():
    """Pricing asks whether the native kernels are built (compressors.kernels.native_build.built), never
    builds them: no cost module imports compressors.kernels.native (whose library() compiles), the
    measuring lab, or a way to start a process or load a library."""
    found = [f"{p.relative_to(ROOT)}:{line} imports {name}" for p in _sources("costs")
             for name, line in _modules_imported(p)
             if any(name == bad or name.startswith(bad + ".") for bad in NO_COMPILER)]
    assert not found, "\n".join(found)


PROCESS_OR_STORE = ("subprocess", "multiprocessing", "signal", "ctypes", "sqlite3", "concurrent.futures.process",
                    "processes", "results")


def test_the_simulator_has_no_process_or_store_code():
    """simulator/ is the cluster model only: the process hygiene lives in processes/, the store in
    results/ (written by the pipeline); no simulator module starts, signals or scans a process, opens
    the store or takes one (a parameter named ``store``)."""
    found = [f"{p.relative_to(ROOT)}:{line} imports {name}" for p in _sources("simulator")
             for name, line in _modules_imported(p)
             if any(name == bad or name.startswith(bad + ".") for bad in PROCESS_OR_STORE)]
    found += [f"{p.relative_to(ROOT)}:{n.lineno} {n.attr if isinstance(n, ast.Attribute) else n.id}"
              for p in _sources("simulator") for n in ast.walk(ast.parse(p.read_text()))
              if (isinstance(n, ast.Attribute) and n.attr in ("fork", "kill", "getppid", "ProcessPoolExecutor"))
              or (isinstance(n, ast.Name) and n.id in ("ProcessPoolExecutor", "Store"))]
    found += [f"{p.relative_to(ROOT)}:{n.lineno} takes a store" for p in _sources("simulator")
              for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.arg) and n.arg == "store"]
    found += _lines_matching(lambda line: "/proc" in line, ("simulator",))
    assert not found, "\n".join(found)


def _lines_matching(match, packages=(*LAYERS, "tools"), home: Path | None = None) -> list[str]:
    """``path:line: text`` of every source line in ``packages`` (but ``home``) for which
    ``match(line)`` holds: what a one-home test expects to find nowhere but in the home."""
    return [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
            for package in packages for p in _sources(package) if p != home
            for n, line in enumerate(p.read_text().splitlines(), 1) if match(line)]


DENSITY_RULE = re.compile(r"0(\.0)?\s*<\s*[\w.\[\]()\"']+\s*<=\s*1(\.0)?\b|not\s+\w+\s*>\s*0\s+or\s+\w+\s*>\s*1\b")


def test_the_density_rule_has_one_home():
    """``0 < density <= 1`` is written once, in units.check_density; everything else calls it."""
    home = ROOT / "units" / "__init__.py"
    found = _lines_matching(lambda line: DENSITY_RULE.search(line) and "density" in line.lower(), home=home)
    assert not found, "\n".join(found)
    assert DENSITY_RULE.search(home.read_text())


COUNT_RULE = re.compile(r"not isinstance\((\w+|self\.\w+), \(?(int|numbers\.Integral)\b[\w., ]*\)?\) or \S+ < 1\b")


def test_the_count_rule_has_one_home():
    """"a whole number >= 1" (nodes, ranks, rounds, seeds, a batch) is checked once, in units.check_count."""
    home = ROOT / "units" / "__init__.py"
    found = _lines_matching(COUNT_RULE.search, home=home)
    assert not found, "\n".join(found)
    assert COUNT_RULE.search(home.read_text())


def test_the_unknown_compressor_rule_has_one_home():
    """"unknown compressor …; choose from" is written once, in compressors.check_names; everything else calls it."""
    home = ROOT / "compressors" / "__init__.py"
    found = _lines_matching(lambda line: "unknown compressor" in line and "choose from" in line)
    assert found == [f"compressors/__init__.py:{n}: {line.strip()}" for n, line in
                     enumerate(home.read_text().splitlines(), 1) if "unknown compressor" in line], "\n".join(found)
    assert len(found) == 1


def test_which_compressors_take_a_density_has_one_home():
    """``compressors.takes_density`` is the one rule; nobody re-derives it from the message kind."""
    found = [f"{p.relative_to(ROOT)}:{n}" for package in [*LAYERS] for p in _sources(package)
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"message_kind\([^)]*\)\s*[=!]=\s*\"sparse\"", line) and p != ROOT / "compressors" / "__init__.py"]
    assert not found, found


QUALITY_RULE_USE = re.compile(r"energy_vs_topk[\"']?\]?\)?\s*(>=|<=|>|<)|ENERGY_FLOOR|DENSITY_FACTOR")


def test_the_quality_rule_has_one_home():
    """The verdict's quality rule (achieved density within a factor of the target, energy vs Top-k
    above a floor) is written once, in pipeline/quality.py: nothing else compares energy_vs_topk with
    a number or reads the rule's constants but to quote them (--help, docs)."""
    home = ROOT / "pipeline" / "quality.py"
    found = _lines_matching(QUALITY_RULE_USE.search, home=home)
    assert not found, "\n".join(found)
    assert "def called(" in home.read_text() and QUALITY_RULE_USE.search(home.read_text())


WHICH_MACHINE = re.compile(r"/proc/cpuinfo|platform\.(processor|machine)\(|def (cpuinfo|host_identity|host_key|cpu_identity|march_key)\(")


def test_which_machine_has_one_home():
    """Which machine this is (the CPU read from ``/proc/cpuinfo`` or the platform; the host's identity,
    its key, the CPU identity string, the native build's key) is read and defined once, in
    machine/__init__.py; everything else imports it from there."""
    home = ROOT / "machine" / "__init__.py"
    found = _lines_matching(WHICH_MACHINE.search, home=home)
    assert not found, "\n".join(found)
    assert len(WHICH_MACHINE.findall(home.read_text())) >= 6


def test_the_cache_directory_has_one_reader():
    """``SIDCO_CACHE_DIR`` is read in one place, machine.cache_dir."""
    found = {str(p.relative_to(ROOT)) for package in [*LAYERS, "tools"] for p in _sources(package)
             if "SIDCO_CACHE_DIR" in p.read_text().replace("``$SIDCO_CACHE_DIR``", "")
             and ("environ" in p.read_text())}
    assert found == {"machine/__init__.py"}, found


RESOLVED_ONCE = re.compile(r"device_name|store: Any|resolved=|Request\(None\b|project_request")


def test_the_request_is_resolved_once_and_travels_as_a_projection():
    """``pipeline.project.resolve`` is the one resolver (issue 32): no second device channel
    (``device_name``), no re-entry (``resolved=``), no untyped store in the model or the
    pipeline, no "workload alone" spelled as a request without a cluster."""
    found = _lines_matching(RESOLVED_ONCE.search, ("pipeline", "simulator", "costs", "sidco", "dashboard"))
    assert not found, "\n".join(found)


TTA_VERDICT = re.compile(r"winner: \{|winner: (none|not named)|winner not named")


def test_the_time_to_accuracy_verdict_text_has_one_home():
    """The time-to-accuracy verdict in words is written once, pipeline.tta.verdict_text; both doors print it."""
    home = ROOT / "pipeline" / "tta.py"
    found = _lines_matching(TTA_VERDICT.search, home=home)
    assert not found, "\n".join(found)
    assert TTA_VERDICT.search(home.read_text())


LABEL_RULE = re.compile(r"\}@\{[^}]*(densit|\bd\b|:g\})")


def test_the_pair_label_rule_has_one_home():
    """A (compressor, density) pair is named by one rule, units.Pair.label (``topk@0.01``, the bare
    name without a density): nothing else writes ``name@density``."""
    home = ROOT / "units" / "__init__.py"
    found = _lines_matching(LABEL_RULE.search, home=home)
    assert not found, "\n".join(found)
    assert LABEL_RULE.search(home.read_text())


CLOCK_START = re.compile(r"=\s*(time\.)?(perf_counter|process_time|clock|now)\(\)\s*$", re.MULTILINE)


def test_the_compressor_timing_loop_has_one_home():
    """A compress or decompress is timed in one place, machine.timing.timed (a call between two
    synchronisations on one clock): bench, the profiling children, the host measurements and a
    replay call it instead of starting a clock themselves."""
    home = ROOT / "machine" / "timing.py"
    found = _lines_matching(CLOCK_START.search, ("traces", "measuring", "pipeline"), home=home)
    assert not found, "\n".join(found)
    assert CLOCK_START.search(home.read_text())


def test_the_data_check_has_one_home():
    """A workload's ``--data`` is checked in one place the doors call, pipeline.capture.check_data:
    no other module of the pipeline or the doors builds a data source or re-exports it."""
    home = ROOT / "pipeline" / "capture.py"
    found = _lines_matching(lambda line: "data_source" in line, ("pipeline", "sidco", "dashboard"), home=home)
    assert not found, "\n".join(found)
    assert "def check_data(" in home.read_text()


def _names(value: object) -> bool:
    """Whether ``value`` is a list, tuple or frozenset of names (strings), none empty."""
    return isinstance(value, (list, tuple, frozenset)) and all(isinstance(v, str) and v for v in value)


def test_the_catalog_exports_names_and_choices_only():
    """pipeline.catalog offers the doors names, never behaviour: each name it exports is a constant
    (a name, a stated limit, a tuple or frozenset of names) or one of its CHOICES, a function that
    takes nothing and returns names; everything else a door needs is a pipeline module's function."""
    from pipeline import catalog

    assert set(catalog.__all__) == set(catalog._FROM), "every name the catalog serves is exported, and no other"
    assert catalog.CHOICES <= set(catalog.__all__)
    wrong = []
    for name in catalog.__all__:
        value = getattr(catalog, name)
        if callable(value):
            if name not in catalog.CHOICES or not inspect.isfunction(value) or not _names(value()):
                wrong.append(f"{name} is {value!r}: behaviour, not a name list or a choice")
        elif not (isinstance(value, (str, int)) and not isinstance(value, bool) or _names(value)):
            wrong.append(f"{name} is {value!r}: neither a name, a limit nor a list of names")
    assert not wrong, "\n".join(wrong)
    public = {n for n, v in vars(catalog).items() if not n.startswith("_") and callable(v) and v is not Any}
    assert public <= catalog.CHOICES, f"callables outside CHOICES: {sorted(public - catalog.CHOICES)}"
