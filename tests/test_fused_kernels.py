"""The fused Triton kernels of compressors/kernels/fused.py, checked without a GPU: exactly against the
eager torch path under the Triton interpreter (tests/fused_interpreted.py, in a child process:
``TRITON_INTERPRET=1`` must be set before Triton is imported), and compiled ahead of time to
sm_80 and sm_90 binaries whose register use is read from the binary (``cuobjdump -res-usage``)
and held under :data:`compressors.kernels.fused.REGISTER_CEILING` with no stack (no spill)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from interpreter import run_interpreted

from compressors.kernels import fused


def test_triton_is_installed_for_the_checks():
    """The test extra installs Triton, so these checks run in make test rather than skip."""
    assert fused.available()


def test_the_kernels_match_the_eager_path_under_the_interpreter():
    assert run_interpreted("fused_interpreted.py") >= 99


def resources(cubin: bytes, tmp_path: Path) -> tuple[int, int]:
    """(registers per thread, stack bytes) of the one kernel in ``cubin``."""
    import triton

    path = tmp_path / "kernel.cubin"
    path.write_bytes(cubin)
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    text = subprocess.run([str(tool), "-res-usage", str(path)], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"REG:(\d+)", text).group(1)), int(re.search(r"STACK:(\d+)", text).group(1))


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("kernel", ["statistics", "statistics without pool", "compact", "select", "select_feedback"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_kernels_compile_to_gpu_binaries_that_do_not_spill(kernel, arch, dtype, tmp_path):
    cubin = fused.compile_ahead(kernel.split()[0], arch, dtype, pool="without" not in kernel)
    registers, stack = resources(cubin, tmp_path)
    assert 0 < registers <= fused.REGISTER_CEILING and stack == 0, (kernel, arch, dtype, registers, stack)


@pytest.mark.parametrize("kernel", ["compact", "select", "select_feedback", "statistics"])
def test_the_compaction_reserves_its_range_with_one_atomic_a_block(kernel, tmp_path):
    """The binary's compaction (SIDCo's, the selection primitive's variant, and the pool's in the
    statistics kernel): one global atomic add per block (its output range), not one per element."""
    import triton

    path = tmp_path / "compact.cubin"
    path.write_bytes(fused.compile_ahead(kernel, 90))
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    sass = subprocess.run([str(tool), str(path)], capture_output=True, text=True, check=True).stdout
    assert len(re.findall(r"\b(?:ATOMG|RED)\.E\.ADD", sass)) == 1
