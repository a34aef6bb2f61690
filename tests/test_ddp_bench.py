"""The DDP hook benchmark runs end to end on 2 gloo ranks and its rows add up."""

import pytest

from benchmarks import ddp_bench


@pytest.mark.timeout(240)
def test_bench_rows_compare_compressors_in_one_run():
    rows = ddp_bench.run(["none", "topk"], density=0.05, workers=2, steps=3, numel=5000)
    by_name = {row["compressor"]: row for row in rows}
    assert list(by_name) == ["none", "topk"]
    numel = by_name["none"]["numel"]
    assert 4000 <= numel <= 6000
    assert by_name["none"]["bytes_sent_per_step"] == numel * 4
    assert by_name["none"]["step_over_none"] == 1.0
    topk = by_name["topk"]
    assert 0 < topk["bytes_sent_per_step"] < 0.25 * numel * 4
    assert topk["step_s"] > 0 and topk["hook_comm_s"] > 0 and topk["hook_compress_s"] > 0
    assert topk["step_over_none"] == pytest.approx(topk["step_s"] / by_name["none"]["step_s"])


def test_bench_rejects_bad_input_before_spawning():
    with pytest.raises(ValueError, match="unknown compressor"):
        ddp_bench.run(["zip"], density=0.01, workers=2, steps=3, numel=5000)
    with pytest.raises(ValueError, match="--workers >= 2"):
        ddp_bench.run(["topk"], density=0.01, workers=1, steps=3, numel=5000)


def test_bench_cli_reports_bad_input_as_exit_code_2(capsys):
    assert ddp_bench.main(["--density", "2"]) == 2
    assert "density" in capsys.readouterr().err
