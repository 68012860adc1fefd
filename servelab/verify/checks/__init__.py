"""The verify checks, by theme. Importing this package registers every check, in the order the runner runs them:
the order of the imports below (docs/verify.md describes each check).

    registry      CHECKS, @check, CheckContext, Evidence, CheckVerdict, Findings
    common        validation shared by several checks (requests, usage, content, reading a chat stream)
    basic         models, chat, chat_stream: the story's checks
    completions   completions
    streaming     stream_framing
    limits        max_tokens, stop
    usage         usage, usage_count
    determinism   determinism, determinism_concurrent
    concurrency   concurrency
    reasoning     reasoning
    tools         tool_calls
    served        shared by the endpoint checks below: "not served" statuses, typed event streams
    embeddings    embeddings
    rerank        rerank
    structured    structured_output
    tools_stream  tool_calls_stream
    responses_api responses_api
    messages_api  messages_api
    images        images (chat with an image)
    errors        error_unknown_model, error_invalid_params, error_context
    sdk           openai_sdk
"""

from servelab.verify.checks.registry import (CHECKS, Check, CheckContext, CheckFailed, CheckFn, CheckVerdict, Evidence,
                                             Findings, check, skip)
from servelab.verify.checks.common import (CHAT_PROMPT, FINISH_REASONS, StreamReading, chat_request, check_content,
                                           check_usage, first_difference, is_int, quoted, read_chat_stream,
                                           reasoning_of)
# Registration order = run order: cheap, basic checks first; the heavier and the error-provoking ones last.
from servelab.verify.checks import basic  # noqa: F401
from servelab.verify.checks import completions  # noqa: F401
from servelab.verify.checks import streaming  # noqa: F401
from servelab.verify.checks import limits  # noqa: F401
from servelab.verify.checks import usage  # noqa: F401
from servelab.verify.checks import determinism  # noqa: F401
from servelab.verify.checks import concurrency  # noqa: F401
from servelab.verify.checks import reasoning  # noqa: F401
from servelab.verify.checks import tools  # noqa: F401
from servelab.verify.checks import embeddings  # noqa: F401
from servelab.verify.checks import rerank  # noqa: F401
from servelab.verify.checks import structured  # noqa: F401
from servelab.verify.checks import tools_stream  # noqa: F401
from servelab.verify.checks import responses_api  # noqa: F401
from servelab.verify.checks import messages_api  # noqa: F401
from servelab.verify.checks import images  # noqa: F401
from servelab.verify.checks import errors  # noqa: F401
from servelab.verify.checks import sdk  # noqa: F401
from servelab.verify.checks.basic import discover_model, listed_model_ids

__all__ = ["CHAT_PROMPT", "CHECKS", "Check", "CheckContext", "CheckFailed", "CheckFn", "Evidence", "FINISH_REASONS",
           "Findings", "StreamReading", "CheckVerdict", "chat_request", "check", "check_content", "check_usage",
           "discover_model", "first_difference", "is_int", "listed_model_ids", "quoted", "read_chat_stream",
           "reasoning_of", "skip"]
