"""Building and combining lint findings, the same way for every engine."""

from __future__ import annotations

from servelab.records import LintFinding

_RANK = {"info": 0, "warn": 1, "serious": 2}


def finding(setting: str, severity: str, why: str) -> LintFinding:
    return LintFinding(setting=setting, severity=severity, why=why)  # type: ignore[arg-type]


def merge(findings: list[LintFinding]) -> list[LintFinding]:
    """One finding per setting: the most severe, with the reasons of every source that found it (a flag seen on
    the command line and confirmed by the server's own config is one problem, not two)."""
    by_setting: dict[str, LintFinding] = {}
    for f in findings:
        seen = by_setting.get(f.setting)
        if seen is None:
            by_setting[f.setting] = f
            continue
        worst = f if _RANK[f.severity] > _RANK[seen.severity] else seen
        whys = seen.why if f.why in seen.why else f"{seen.why}; {f.why}"
        by_setting[f.setting] = LintFinding(setting=f.setting, severity=worst.severity, why=whys)
    return sorted(by_setting.values(), key=lambda f: -_RANK[f.severity])


def is_serious(findings: list[LintFinding]) -> bool:
    return any(f.severity == "serious" for f in findings)
