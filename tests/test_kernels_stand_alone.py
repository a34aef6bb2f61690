"""compressors/kernels/ stands below the compressors: no module under it imports
compressors.sidco (the fused path shares SIDCo's stage-loop reads through
compressors.numerics.tails instead), read from the source by ast, imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

KERNELS = Path(__file__).resolve().parent.parent / "compressors" / "kernels"
FORBIDDEN = "compressors.sidco"


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, by its absolute dotted name (``from a import b`` counts as
    ``a`` and ``a.b``: ``b`` may be a module)."""
    package = "compressors.kernels"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against compressors.kernels
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def reaches_sidco(modules: set[str]) -> list[str]:
    """The names in ``modules`` that are compressors.sidco or inside it."""
    return sorted(m for m in modules if m == FORBIDDEN or m.startswith(FORBIDDEN + "."))


def test_no_kernel_module_imports_compressors_sidco():
    files = sorted(KERNELS.rglob("*.py"))
    assert any(f.name == "sidco_fused.py" for f in files)  # the module that used to reach back
    offenders = {str(f.relative_to(KERNELS.parent.parent)): reaches_sidco(imported(f)) for f in files}
    assert not {f: names for f, names in offenders.items() if names}


def test_the_check_sees_every_form_of_the_import(tmp_path):
    """The check would fail on each way of writing the import (so a pass above means something)."""
    forms = ["import compressors.sidco", "from compressors.sidco import _Ops", "from compressors import sidco",
             "def f():\n    from compressors.sidco import SIDCo\n", "from .. import sidco", "import compressors.sidco as s"]
    for i, form in enumerate(forms):
        path = tmp_path / f"m{i}.py"
        path.write_text(form + "\n")
        assert reaches_sidco(imported(path)), form
    clean = tmp_path / "clean.py"
    clean.write_text("from compressors.numerics.tails import Ops\nimport compressors.sidcore\n")
    assert not reaches_sidco(imported(clean))
