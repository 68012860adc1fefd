"""A pytest plugin for CI's slow tier (.ci/run loads it with `-p pytest_no_skip`): a skipped test is a failure.

The slow tier's tests skip when their engine is not set up (no .venv-vllm, Ray not importable, ...), which is right
on a developer's machine and wrong in CI, where scripts/setup-slow-tier.sh has just set everything up: a skip there
means a test that never ran while CI said green. Each skip becomes an error that keeps the skip's reason; xfail is
left alone. A module skipped while it is collected (`pytest.importorskip` at its top) becomes a collection error,
whatever its markers would have been, since they cannot be known without importing it.
"""

from __future__ import annotations

import pytest

PREFIX = "skipped in CI, where every test of the slow tier must run (scripts/setup-slow-tier.sh sets them up): "


def _reason(longrepr: object) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: why")
        return str(longrepr[2])
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = PREFIX + _reason(report.longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> object:
    outcome = yield
    report = outcome.get_result()
    if report.skipped:
        report.outcome = "failed"
        report.longrepr = PREFIX + _reason(report.longrepr)
