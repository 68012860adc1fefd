"""verify --junit: the JUnit XML CI systems read, validated against a JUnit schema (tests/fixtures/junit)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from servelab.records import CheckResult, VerifyResult
from servelab.verify.junit import junit_document, write_junit

xmlschema = pytest.importorskip("xmlschema")

SCHEMA = Path(__file__).parent / "fixtures" / "junit" / "junit-ci.xsd"


@pytest.fixture(scope="module")
def schema():
    return xmlschema.XMLSchema(str(SCHEMA))


def _result() -> VerifyResult:
    return VerifyResult(url="http://127.0.0.1:8080", model="smollm2", checks=[
        CheckResult(id="models", title="/v1/models lists a model", outcome="pass", reason="1 model listed",
                    request={"method": "GET", "path": "/v1/models"}, response_excerpt='{"data": [{"id": "m"}]}',
                    duration_ms=3.2),
        CheckResult(id="chat", title="chat completion", outcome="warn", reason="answered 'Five.' to 2+2",
                    request={"messages": [{"role": "user", "content": "What is 2+2?"}]},
                    response_excerpt="Five.", duration_ms=120.5),
        CheckResult(id="chat_stream", title="streamed chat", outcome="fail",
                    reason="the stream ended without [DONE] <&> \"quoted\"",
                    request={"stream": True}, response_excerpt="data: {\"x\": 1}\x00\x1b[2J\ud800 café",
                    duration_ms=None),
        CheckResult(id="tools", title="tool calls", outcome="skip", reason="the server has no tool template"),
        CheckResult(id="determinism", title="determinism", outcome="skip", reason="not selected"),
    ])


def test_junit_document_is_valid_and_carries_each_check(schema):
    doc = junit_document([("http://127.0.0.1:8080", _result())])
    schema.validate(doc.decode("utf-8"))  # raises with the schema's reason if invalid
    root = ET.fromstring(doc)
    assert root.tag == "testsuites" and root.get("tests") == "4" and root.get("failures") == "1"
    suite = root.find("testsuite")
    assert suite.get("skipped") == "1" and suite.get("errors") == "0"
    cases = {c.get("name").split(":")[0]: c for c in suite.findall("testcase")}
    assert set(cases) == {"models", "chat", "chat_stream", "tools"}
    failure = cases["chat_stream"].find("failure")
    assert failure is not None and failure.get("message") == "the stream ended without [DONE] <&> \"quoted\""
    # the request and the response excerpt are the test's output; characters XML cannot hold are escaped
    out = cases["chat_stream"].find("system-out").text
    assert '"stream": true' in out and "\\x00\\x1b[2J" in out and "café" in out and "\\ud800" in out
    assert cases["chat"].find("failure") is None and "WARNING: answered 'Five.'" in cases["chat"].find(
        "system-err").text
    assert cases["tools"].find("skipped").get("message") == "the server has no tool template"
    assert cases["models"].find("failure") is None and float(cases["models"].get("time")) == pytest.approx(0.0032, abs=5e-4)


def test_schema_rejects_what_ci_cannot_read(schema):
    """The schema is not a rubber stamp: a test case without a name or with two outcomes is refused."""
    good = junit_document([("s", _result())]).decode()
    assert schema.is_valid(good)
    assert not schema.is_valid(good.replace('<testcase name="models: /v1/models lists a model" ', "<testcase "))
    two = good.replace('<skipped message="the server has no tool template" />',
                       '<skipped message="x" /><failure type="fail" message="y" />')
    assert two != good and not schema.is_valid(two)


def test_several_suites_and_atomic_write(tmp_path, schema):
    path = write_junit(tmp_path / "ci" / "verify.xml", [("one-slot", _result()), ("eight-slots", _result())],
                       "servelab run demo")
    schema.validate(str(path))
    root = ET.parse(path).getroot()
    assert [s.get("name") for s in root.findall("testsuite")] == ["one-slot", "eight-slots"]
    assert root.get("tests") == "8" and root.get("failures") == "2"
    assert not list(path.parent.glob(".*.tmp"))


def test_verify_cli_writes_junit(tmp_path, schema):
    """`servelab verify URL --junit FILE` against the test double of a well-behaved server (verify's own fault
    tests use it): every selected check is a test case, and the exit code is verify's."""
    from openai_fake import FakeOpenAI, serving

    out = tmp_path / "verify.xml"
    with serving(FakeOpenAI().app()) as url:
        proc = subprocess.run([sys.executable, "-m", "servelab.cli", "verify", url, "--only", "models",
                               "--only", "chat", "--only", "chat_stream", "--junit", str(out)],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"junit: {out}" in proc.stderr
    schema.validate(str(out))
    names = [c.get("name").split(":")[0] for c in ET.parse(out).getroot().iter("testcase")]
    assert names == ["models", "chat", "chat_stream"]


def test_run_writes_one_suite_per_cell(tmp_path, schema):
    """`servelab run EXP --junit FILE`: each cell's verify step is a test suite named after the cell (cells are
    URLs of the calibration server, so nothing is launched)."""
    from servelab.calibration import Script, start_calibration_server

    with start_calibration_server(Script(output_tokens=6, ttft_ms=5, itl_ms=3)) as cal:
        exp = tmp_path / "exp.yaml"
        exp.write_text("name: junit-demo\nbench: {single_requests: 2, max_tokens: 6, warmup: 0, sweep: false}\n"
                       "verify: {only: [models, chat_stream]}\ncontention: {reruns: 0}\ncells:\n"
                       f"  - {{name: first, url: {cal.url}}}\n  - {{name: second, url: {cal.url}}}\n")
        out = tmp_path / "verify.xml"
        proc = subprocess.run([sys.executable, "-m", "servelab.cli", "run", str(exp), "--out", str(tmp_path / "runs"),
                               "--junit", str(out)], capture_output=True, text=True, timeout=240)
    assert proc.returncode in (0, 1), proc.stderr  # 1 when a check fails on the calibration server
    schema.validate(str(out))
    root = ET.parse(out).getroot()
    assert [s.get("name") for s in root.findall("testsuite")] == ["first", "second"]
    assert all(len(s.findall("testcase")) == 2 for s in root.findall("testsuite"))
