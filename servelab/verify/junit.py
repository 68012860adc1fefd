"""Verify results as JUnit XML, the test report format CI systems read (GitLab's test reports, Jenkins' junit and
xunit steps, GitHub test-reporter actions).

One <testsuite> per verified server (a `verify` call, or each cell of `run`), one <testcase> per check that ran:

- pass: an empty test case;
- fail: <failure type="fail" message=REASON>, so the CI marks the test failed;
- warn: a passing test case (verify exits 0 on warnings, and so should the CI's test count) whose system-err says
  "WARNING: REASON", so the reason is shown beside the test;
- skip: <skipped message=REASON>.

A suite's <properties> hold the server's URL and model and, for a cell of `run`, what its GPUs did per level
(docs/metrics.md#gpu): `gpu.<step>.<level>.<figure>` for energy per output token, output tokens per joule, mean
power and SM activity (`gpu.t<trial>.<step>.<level>.<figure>` when the cell ran several trials), so a CI can chart
them; a cell whose levels had no GPU telemetry has one property, `gpu`, saying "not measured: why".

Every test case's <system-out> holds the reason, the request sent (JSON) and the response excerpt, which is what
Jenkins and GitLab show for a test. Checks not selected (--only/--skip) are not test cases, as they are not rows of
the terminal table.

Text a server wrote can hold characters XML 1.0 cannot carry (NUL, ESC, lone surrogates): they are written as
`\\xNN` escapes, so the file always parses. Secrets were already redacted from the results (redaction.py).
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from servelab.records import CheckResult, RunSummary, VerifyResult
from servelab.textsafe import visible

NOT_SELECTED = "not selected"  # verify/runner.py's reason for a check --only or --skip left out

# Characters XML 1.0 does not allow in a document, whatever the escaping.
_INVALID = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(value: object) -> str:
    """Text XML 1.0 allows, with every control character (C0, DEL, C1, bidi) shown as an escape, as textsafe
    shows it everywhere people read: a JUnit file printed in a terminal runs nothing."""
    return _INVALID.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}",
                        visible(value))


def _seconds(ms: float | None) -> str:
    return f"{max(ms or 0.0, 0.0) / 1000:.3f}"


def _classname(result: VerifyResult, suite: str) -> str:
    # Dots group test cases in Jenkins ("package.class"); a URL's dots and colons would split it oddly.
    words = re.sub(r"[^A-Za-z0-9_-]+", "_", suite).strip("_") or "server"
    return f"servelab.verify.{words}"


def case_output(check: CheckResult) -> str:
    parts = [f"{check.outcome.upper()}: {check.reason}"]
    if check.request is not None:
        parts.append("request:\n" + json.dumps(check.request, indent=2, ensure_ascii=False, default=str))
    if check.response_excerpt:
        parts.append("response excerpt:\n" + check.response_excerpt)
    return "\n\n".join(parts) + "\n"


# The GPU figures a cell's suite carries as properties, per level (bench/figures.py GPU_FIGURES keys).
GPU_PROPERTIES = ("j_per_output_token", "output_tokens_per_j", "gpu_power_w_mean", "gpu_sm_active_pct_mean")


def gpu_properties(summary: RunSummary) -> list[tuple[str, str]]:
    """What a run's GPUs did, as (name, value) properties (module docstring); [] for a run whose levels have no GPU
    summary at all (written before GPU telemetry)."""
    several = len(summary.trials) > 1
    levels = [(trial.index, step.name, s) for trial in summary.trials for step in trial.steps
              for s in step.result.levels if s.gpu is not None]
    if not levels:
        return []
    if not any(s.gpu.measured for _, _, s in levels):
        reasons = dict.fromkeys((s.gpu.reason or "unknown").removeprefix("not measured: ") for _, _, s in levels)
        return [("gpu", f"not measured: {'; '.join(reasons)}")]
    out = []
    for trial, step, s in levels:
        prefix = f"gpu.{f't{trial + 1}.' if several else ''}{step}.{s.tag}"
        if not s.gpu.measured:
            out.append((prefix, f"not measured: {(s.gpu.reason or 'unknown').removeprefix('not measured: ')}"))
            continue
        for key in GPU_PROPERTIES:
            fig = s.figures.get(key)
            if fig is not None and fig.value is not None:
                out.append((f"{prefix}.{key}", repr(float(fig.value))))
    return out


def testsuite(result: VerifyResult, name: str, index: int = 0, timestamp: float | None = None,
              properties: Sequence[tuple[str, str]] = ()) -> ET.Element:
    checks = [c for c in result.checks if not (c.outcome == "skip" and c.reason == NOT_SELECTED)]
    failures = sum(1 for c in checks if c.outcome == "fail")
    skipped = sum(1 for c in checks if c.outcome == "skip")
    total_ms = sum(c.duration_ms or 0.0 for c in checks)
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(timestamp if timestamp is not None else time.time()))
    suite = ET.Element("testsuite", {
        "name": xml_text(name), "tests": str(len(checks)), "failures": str(failures), "errors": "0",
        "skipped": str(skipped), "time": _seconds(total_ms), "timestamp": when,
        "hostname": xml_text(socket.gethostname() or "localhost"), "id": str(index), "package": "servelab.verify"})
    props = ET.SubElement(suite, "properties")
    for key, value in (("url", result.url), ("model", result.model or ""), *properties):
        ET.SubElement(props, "property", {"name": xml_text(key), "value": xml_text(value)})
    classname = _classname(result, name)
    for check in checks:
        case = ET.SubElement(suite, "testcase", {"name": xml_text(f"{check.id}: {check.title}"),
                                                 "classname": classname, "time": _seconds(check.duration_ms)})
        reason = xml_text(check.reason)
        if check.outcome == "fail":
            ET.SubElement(case, "failure", {"type": "fail", "message": reason}).text = xml_text(case_output(check))
        elif check.outcome == "skip":
            ET.SubElement(case, "skipped", {"message": reason})
        ET.SubElement(case, "system-out").text = xml_text(case_output(check))
        if check.outcome == "warn":
            ET.SubElement(case, "system-err").text = f"WARNING: {reason}\n"
    # The Ant schema requires the suite's own output elements, even empty
    ET.SubElement(suite, "system-out").text = ""
    ET.SubElement(suite, "system-err").text = ""
    return suite


def junit_document(suites: Sequence[tuple[str, VerifyResult] | tuple[str, VerifyResult, Sequence[tuple[str, str]]]],
                   name: str = "servelab verify") -> bytes:
    """A <testsuites> document of one suite per (name, result) or (name, result, extra properties)."""
    root = ET.Element("testsuites", {"name": xml_text(name)})
    elements = [testsuite(suite[1], suite[0], i, properties=suite[2] if len(suite) > 2 else ())
                for i, suite in enumerate(suites)]
    for key in ("tests", "failures", "errors"):
        root.set(key, str(sum(int(e.get(key, "0")) for e in elements)))
    root.set("time", f"{sum(float(e.get('time', '0')) for e in elements):.3f}")
    root.extend(elements)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def write_junit(path: Path, suites: Sequence, name: str = "servelab verify") -> Path:
    """Write the document atomically (a CI never reads half a file); a UserError naming the path if it cannot."""
    from servelab.errors import UserError, os_error_words

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if path.parent and not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(junit_document(suites, name))
        tmp.replace(path)
    except OSError as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise UserError(f"cannot write the JUnit file {path}: {os_error_words(exc)}") from None
    return path
