"""The verify checks, by theme. Importing this package registers every check, in the order the runner runs them:
the order of the imports below.

    registry   CHECKS, @check, CheckContext, Evidence, Verdict, Findings
    common     validation shared by several checks (usage, content, reading a chat stream)
    basic      models, chat, chat_stream: the story's checks
"""

from servelab.verify.checks.registry import (CHECKS, Check, CheckContext, CheckFailed, CheckFn, Evidence, Findings,
                                             Verdict, check, skip)
from servelab.verify.checks.common import (CHAT_PROMPT, FINISH_REASONS, StreamReading, chat_request, check_content,
                                           check_usage, first_difference, is_int, quoted, read_chat_stream,
                                           reasoning_of)
from servelab.verify.checks import basic  # noqa: F401  (registers models, chat, chat_stream)
from servelab.verify.checks.basic import discover_model, listed_model_ids

__all__ = ["CHAT_PROMPT", "CHECKS", "Check", "CheckContext", "CheckFailed", "CheckFn", "Evidence", "FINISH_REASONS",
           "Findings", "StreamReading", "Verdict", "chat_request", "check", "check_content", "check_usage",
           "discover_model", "first_difference", "is_int", "listed_model_ids", "quoted", "read_chat_stream",
           "reasoning_of", "skip"]
