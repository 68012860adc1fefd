"""What the GPUs did, in `run --junit`: each cell's suite carries its levels' GPU figures as properties (or one
`gpu` property saying why they were not measured), and the document still validates against the JUnit schema."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from gpu_runs import expected_j_per_token, with_gpu, without_gpu
from servelab.verify.junit import gpu_properties, junit_document
from synthetic_runs import synthetic_run
from test_junit import SCHEMA

xmlschema = pytest.importorskip("xmlschema")


def _properties(doc: bytes, suite: int) -> dict[str, str]:
    root = ET.fromstring(doc)
    return {p.get("name"): p.get("value") for p in root.findall("testsuite")[suite].find("properties")}


def test_a_cells_suite_carries_its_gpu_figures_and_a_bare_one_says_why() -> None:
    measured, _ = synthetic_run("gpu")
    for level in measured.trials[0].levels:
        with_gpu(level, power_w=400.0)
    bare, _ = synthetic_run("cpu")
    for level in bare.trials[0].levels:
        without_gpu(level)
    old, _ = synthetic_run("old")
    doc = junit_document([("gpu", measured.verify, gpu_properties(measured)),
                          ("cpu", bare.verify, gpu_properties(bare)), ("old", old.verify, gpu_properties(old))])
    xmlschema.XMLSchema(str(SCHEMA)).validate(ET.fromstring(doc))
    props = _properties(doc, 0)
    for level in measured.trials[0].sweep.levels:
        j = float(props[f"gpu.sweep.{level.tag}.j_per_output_token"])
        assert j == pytest.approx(expected_j_per_token(level, power_w=400.0))
        assert float(props[f"gpu.sweep.{level.tag}.output_tokens_per_j"]) == pytest.approx(1 / j)
        assert float(props[f"gpu.sweep.{level.tag}.gpu_power_w_mean"]) == pytest.approx(800.0)
        assert float(props[f"gpu.sweep.{level.tag}.gpu_sm_active_pct_mean"]) == pytest.approx(80.0)
    assert props["url"] == "http://127.0.0.1:1"
    assert {k: v for k, v in _properties(doc, 1).items() if k.startswith("gpu")} == \
        {"gpu": "not measured: no GPU telemetry source"}
    assert not any(k.startswith("gpu") for k in _properties(doc, 2))  # from before GPU telemetry: nothing


def test_several_trials_are_named_apart() -> None:
    summary, _ = synthetic_run("trials", trials=2)
    for trial in summary.trials:
        for level in trial.levels:
            with_gpu(level)
    names = [name for name, _ in gpu_properties(summary)]
    assert "gpu.t1.sweep.c1.j_per_output_token" in names and "gpu.t2.single.single.j_per_output_token" in names
