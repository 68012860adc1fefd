"""`servelab verify`: does a server speak the OpenAI API the way clients and benchmarks assume?

    result = verify("http://127.0.0.1:8080")            # or: await run_checks(url, model=..., only=[...])
    for c in result.checks: print(c.id, c.outcome, c.reason)

Modules: `http` (requests, transport errors as reasons; SSE parsing is `servelab.protocol.sse`), `checks` (the
registry and one function per check), `runner` (deadlines, selection, the VerifyResult).
"""

from servelab.verify.checks import CHECKS, Check, CheckContext, CheckFailed, CheckVerdict, Evidence, check
from servelab.verify.runner import run_checks, verify

__all__ = ["CHECKS", "Check", "CheckContext", "CheckFailed", "CheckVerdict", "Evidence", "check", "run_checks",
           "verify"]
