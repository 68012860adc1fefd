"""Thinking that arrives in `content`: a reasoning model served without its reasoning parser.

The story: SGLang served Kimi-K2.5 without `--reasoning-parser kimi_k2`, and "What is 2+2? Reply in one word."
(max_tokens 32) came back as 32 tokens of " The user is asking for the answer to "2+2" and wants me to reply in one
word.\\n\\n 2+2 = 4\\n\\n The word", `reasoning_content: null`, `finish_reason: length`. The text contains a 4, so
a check that only looks for the answer passes it.

Signals, each reported as evidence:
- an instruction that asks for one word answered with many;
- `finish_reason: length` at the budget;
- text that talks about the request ("The user is asking…", "Okay, so…", "We need to…", "Let me think…"), or
  thinking tags (`<think>`, `</think>`, Kimi's `◁think▷`, GPT-OSS's `<|channel|>analysis`);
- `reasoning_content` / `reasoning` null or absent;
- the served model id or path naming a known reasoning family (engines/reasoning_families.py).

The judgement: FAIL when the model is a known reasoning family and its thinking arrives in content (the text
signals, or many words cut at the budget); WARN on the text signals alone (a model servelab does not know). The
reason names the fix for the engine behind the URL, recognised as `bench` recognises it (engines/detect.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from servelab.engines.reasoning_families import ReasoningFamily, family_of, fix_for
from servelab.verify.checks.common import is_int, quoted
from servelab.verify.checks.registry import CheckContext, Findings

# Sentences a model writes about the request while thinking, not while answering it.
TALKS_ABOUT_REQUEST = re.compile(
    r"(?:^|[.!?:\n])\s*(?:the user (?:is asking|asks|asked|wants|has asked|said|says|is requesting|requests)"
    r"|(?:okay|ok|alright|all right),? so\b|so,? the user\b|we need to\b|we are asked\b"
    r"|let me (?:think|see|check|work|figure|recall|compute|calculate)\b|let's (?:think|see|figure|break)\b"
    r"|i need to (?:figure|answer|think|determine|respond)\b|first,? i (?:need|should|will)\b|hmm+\b)",
    re.IGNORECASE)
THINK_MARKERS = re.compile(r"</?think>|◁/?think▷|<\|channel\|>\s*analysis|<\|start\|>assistant", re.IGNORECASE)
ONE_WORD = re.compile(r"\b(?:in|with) (?:one|a single) word\b|\bone[- ]word\b", re.IGNORECASE)
# More words than this for "one word" is an essay, not an answer with a little punctuation or a full stop.
ONE_WORD_SLACK = 3


@dataclass
class ThinkingInContent:
    """What the signals said about one answer."""

    signals: list[str] = field(default_factory=list)  # every signal seen, as evidence
    text_signals: list[str] = field(default_factory=list)  # the ones read from the text itself
    family: ReasoningFamily | None = None
    model: str | None = None
    many_words_at_budget: bool = False

    @property
    def thinking_in_content(self) -> bool:
        """The family is known and its thinking is in content (text signals, or an essay cut at the budget)."""
        return self.family is not None and (bool(self.text_signals) or self.many_words_at_budget)

    @property
    def suspect(self) -> bool:
        """Text signals without a known family: worth a warning."""
        return self.family is None and bool(self.text_signals)


def read_signals(*, prompt: str, text: str, message: dict[str, Any], finish_reason: Any, usage: Any,
                 max_tokens: int | None, models: list[Any]) -> ThinkingInContent:
    """The signals of one answer (`message` is choices[0].message, or the deltas gathered). `models`: the ids the
    server goes by (the model asked for, the response's `model`); the first that names a family counts."""
    family = family_of(*models)
    named = [m for m in models if isinstance(m, str) and m]
    model = next((m for m in named if family and family.matches(m)), named[0] if named else None)
    seen = ThinkingInContent(model=model, family=family)
    if _reasoning_present(message):
        return seen  # the server separates thinking: nothing leaked (a `<think>` in content is `reasoning`'s)
    words = len(text.split())
    many = bool(ONE_WORD.search(prompt)) and words > ONE_WORD_SLACK
    if many:
        seen.signals.append(f"asked for one word, got {words} words")
    completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
    at_budget = finish_reason == "length" and (max_tokens is None or not is_int(completion)
                                               or completion >= max_tokens)
    if at_budget:
        spent = f", completion_tokens {completion}" if is_int(completion) else ""
        seen.signals.append(f"finish_reason length at the budget (max_tokens {max_tokens}{spent})")
    talk = TALKS_ABOUT_REQUEST.search(text)
    if talk:
        seen.text_signals.append(f"the text talks about the request ({quoted(text[talk.start():].strip(), 40)})")
    marker = THINK_MARKERS.search(text)
    if marker:
        seen.text_signals.append(f"thinking tags in content ({quoted(marker.group())} at character "
                                 f"{marker.start()})")
    seen.signals += seen.text_signals
    if seen.signals:
        nulls = [name for name in ("reasoning_content", "reasoning") if name in message]
        seen.signals.append(f"{' and '.join(nulls) or 'reasoning_content/reasoning'} "
                            f"{'null' if nulls else 'absent'}")
    if seen.family is not None:
        seen.signals.append(f"model {model!r} is {seen.family.name}, a reasoning model")
    seen.many_words_at_budget = many and at_budget
    return seen


def _reasoning_present(message: dict[str, Any]) -> bool:
    return any(isinstance(message.get(name), str) and message[name].strip()
               for name in ("reasoning_content", "reasoning"))


async def served_engine(ctx: CheckContext) -> str | None:
    """'sglang', 'vllm' or 'llamacpp' for the engine behind the URL (asked once, kept in ctx.facts); None when
    it is none of those or does not say. SGLang's /server_info also says which reasoning parser it runs."""
    if "engine" not in ctx.facts:
        from servelab.engines.detect import detect_engine  # imports every adapter: only when a verdict needs it

        adapter = await detect_engine(ctx.session, ctx.base_url)
        ctx.facts["engine"] = adapter.reasoning_kind if adapter else None
    return ctx.facts["engine"]


async def judge_thinking(ctx: CheckContext, seen: ThinkingInContent, findings: Findings, where: str) -> None:
    """FAIL (known family) or WARN (text signals only) with the evidence and the fix for the engine served."""
    if not (seen.thinking_in_content or seen.suspect):
        return
    engine = await served_engine(ctx)
    evidence = "; ".join(seen.signals)
    if seen.thinking_in_content:
        assert seen.family is not None
        findings.fail(f"{where}: the model's thinking arrived in content, not in reasoning_content/reasoning "
                      f"({evidence}): the server runs without the reasoning parser for {seen.family.name}; "
                      f"fix: {fix_for(engine, seen.family)}")
    else:
        findings.warn(f"{where}: this looks like thinking in content ({evidence}): if the model reasons, start "
                      f"the server with its reasoning parser: {fix_for(engine, None)}")
