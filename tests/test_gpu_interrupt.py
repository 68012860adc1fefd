"""Ctrl-C during a level stops the GPU sampler on the way out: the series file is closed whole (its end line), and
the interrupted level still has what the GPUs did over the time it ran. The bench process has the NVML double
first on its sys.path (tests/test_gpu_bench.py), measuring the calibration server on loopback."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from servelab.host.gpu_telemetry.sampler import SERIES_FILE, iter_lines
from servelab.records import Summary
from test_cancelled import interrupt_bench, slow  # noqa: F401 (the fixture)
from test_gpu_bench import WITH_DOUBLE


def test_ctrl_c_stops_the_sampler_and_keeps_the_partial_levels_gpu(slow, tmp_path: Path, monkeypatch  # noqa: F811
                                                                    ) -> None:
    import test_cancelled

    monkeypatch.setattr(test_cancelled, "SERVELAB", [sys.executable, "-c", WITH_DOUBLE])
    proc, run = interrupt_bench(slow.url, tmp_path, "--mode", "concurrency", "--concurrency", "2", in_flight=2)
    assert proc.returncode == 130, proc.stderr
    lines = list(iter_lines(run / SERIES_FILE))
    assert lines[0]["kind"] == "header" and lines[-1]["kind"] == "end", lines[-1]
    (level,) = [Summary.model_validate(d) for d in json.loads((run / "summary.json").read_text())["levels"]]
    assert level.gpu is not None and level.gpu.measured and level.gpu.source == "nvml" and level.gpu.energy_j > 0
    # every request was cut off: no output tokens counted, so no energy per token, and the note says why
    fig = level.figures["j_per_output_token"]
    assert fig.value is None and fig.note.startswith("not measured: ")
    assert level.figures["gpu_power_w_mean"].value > 0
    # --csv on the way out: the level's GPUs and the series beside records.csv and levels.csv
    assert (run / "gpus.csv").read_text().count("\n") == 1 + 8
    assert (run / "gpu_series.csv").read_text().count("\n") > 8
