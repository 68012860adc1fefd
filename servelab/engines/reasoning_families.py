"""Reasoning model families, and the reasoning parser each engine names for them.

A reasoning model writes its thinking before its answer. An engine separates the two only when it runs the
family's parser; without one the thinking lands in `content` (the story: Kimi-K2.5 on SGLang without
`--reasoning-parser kimi_k2` answered "What is 2+2? Reply in one word." with 32 tokens of "The user is asking…"),
and every answer figure (TTFO, answer tokens) counts thinking as answer. verify names the fix from this table and
lint flags a known family launched without its parser.

Where each name was read (the engines' own parser registries, not their docs' prose):

- SGLang: `ReasoningParser.DetectorMap` in python/sglang/srt/parser/reasoning_parser.py (earlier releases:
  python/sglang/srt/reasoning_parser.py). The names below are the ones sglang 0.5.10.post1 registers
  (shared/research/engines.md §0.5, read from the sdist; the same map read again in the code index): deepseek-r1, deepseek-v3, qwen3, qwen3-thinking, glm45, gpt-oss, kimi,
  kimi_k2, mimo, minimax, minimax-append-think, step3, step3p5, mistral, nemotron_3, interns1. `kimi_k2` is
  `KimiK2Detector` ("Detector for Kimi K2 models", `<think>`…`</think>`); `kimi` is the older `KimiDetector`
  (`◁think▷`…`◁/think▷`, Kimi-VL/K1.5 thinking). Which model takes which name: SGLang's
  docs/advanced_features/separate_reasoning.ipynb table, and the detectors' docstrings.
- vLLM: `_REASONING_PARSERS_TO_REGISTER` in vllm/reasoning/__init__.py, read in vllm-project/vllm main (commit
  0064cc9c, Nov 2026): deepseek_r1, deepseek_v3, ernie45, glm45, glm47, openai_gptoss, granite, hunyuan_a13b,
  kimi_k2, kimi_k3, mimo, minimax_m2, minimax_m2_append_think, mistral, nemotron_v3, olmo3, qwen3, seed_oss,
  step3, step3p5, ... For the 0.33.0 wheel, shared/research/engines.md §0.5 confirms deepseek_r1, qwen3,
  openai_gptoss, glm45, kimi_k2, mistral and granite; the rarer names were not checked against that release.
  Which model takes which name: docs/features/reasoning_outputs.md (QwQ-32B → deepseek_r1; MiniMax-M2 →
  minimax_m2_append_think).
- llama.cpp: no per-family parser. `--reasoning-format FORMAT` (common/arg.cpp, env LLAMA_ARG_THINK): `none`
  leaves thoughts in `message.content`, `deepseek` puts them in `message.reasoning_content`, `deepseek-legacy`
  keeps `<think>` in content and fills reasoning_content too; the default `auto` extracts them for every chat
  template it knows (commit 0c1e570). So the fix on llama.cpp is always `--reasoning-format deepseek` (or
  dropping `--reasoning-format none`), with `--jinja` (on by default).

`thinks_by_default`: whether the family's chat template thinks unless the request turns it off. Hybrids that
think only when asked (DeepSeek-V3.1 with `thinking: true`, Granite 3.2) are warned about, not called serious.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from servelab.engines.lint import finding
from servelab.records import LintFinding

LLAMACPP_FORMAT = "deepseek"  # puts thoughts in message.reasoning_content (and delta.reasoning_content)


@dataclass(frozen=True)
class ReasoningFamily:
    name: str  # as people say it, e.g. "Kimi-K2.5"
    pattern: re.Pattern[str]  # matched against a model id, path or served name (case-insensitive)
    sglang: str | None  # SGLang --reasoning-parser NAME; None: SGLang registers none for this family
    vllm: str | None  # vLLM --reasoning-parser NAME
    thinks_by_default: bool = True
    exclude: re.Pattern[str] | None = None  # ids that match `pattern` but do not reason (instruct/coder variants)
    sglang_also: tuple[str, ...] = ()  # other names that also parse the family correctly
    vllm_also: tuple[str, ...] = ()
    note: str = ""

    def matches(self, model: str) -> bool:
        return bool(self.pattern.search(model)) and not (self.exclude and self.exclude.search(model))

    def parser_for(self, engine: str) -> str | None:
        return {"sglang": self.sglang, "vllm": self.vllm}.get(engine)

    def accepts(self, engine: str, parser: str) -> bool:
        """Whether `parser` is one the engine registers for this family."""
        names = {"sglang": (self.sglang, *self.sglang_also), "vllm": (self.vllm, *self.vllm_also)}.get(engine, ())
        return parser.lower() in {n.lower() for n in names if n}


def _re(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


# Order matters: the first family whose pattern matches wins (specific variants before their family).
FAMILIES: list[ReasoningFamily] = [
    ReasoningFamily("Kimi-K2.5 / K2-Thinking", _re(r"kimi[-_ ]?k2(?:[._-]?[5-9]\b|[._-]?thinking)"), "kimi_k2",
                    "kimi_k2", note="K2.5 and K2.6 think by default; Kimi-K2-Instruct does not reason"),
    ReasoningFamily("Kimi-K3", _re(r"kimi[-_ ]?k3"), None, "kimi_k3",
                    note="SGLang main registers kimi_k3 (reasoning_parser_names.py); 0.5.10 does not"),
    ReasoningFamily("Kimi-VL / K1.5 thinking", _re(r"kimi[-_ ]?(?:vl|k1\.?5).*thinking"), "kimi", None,
                    note="◁think▷ tags"),
    ReasoningFamily("DeepSeek-R1", _re(r"deepseek[-_ ]?r1|r1[-_ ]?distill"), "deepseek-r1", "deepseek_r1",
                    note="R1 omits the opening <think>; the parser assumes thinking until </think>"),
    ReasoningFamily("DeepSeek-V3.1+ (thinking mode)", _re(r"deepseek[-_ ]?v3[._]\d"), "deepseek-v3",
                    "deepseek_v3", thinks_by_default=False,
                    note="hybrid: thinks when the request sets chat_template_kwargs thinking=true"),
    ReasoningFamily("QwQ", _re(r"\bqwq"), "deepseek-r1", "deepseek_r1", sglang_also=("qwen3",),
                    note="the template opens <think> in the prompt, so the output has only </think>"),
    ReasoningFamily("Qwen3-Thinking", _re(r"qwen3.*thinking"), "qwen3-thinking", "qwen3", sglang_also=("qwen3",)),
    ReasoningFamily("Qwen3 (hybrid)", _re(r"qwen3(?:\.\d)?(?:[-_ ]|$)"), "qwen3", "qwen3",
                    sglang_also=("qwen3-thinking",),
                    exclude=_re(r"instruct|coder|embed|rerank|guard|omni.*captioner"),
                    note="thinks unless enable_thinking=false; the 2507 Instruct and Coder models do not reason"),
    ReasoningFamily("GPT-OSS", _re(r"gpt[-_ ]?oss"), "gpt-oss", "openai_gptoss",
                    note="harmony format: the analysis channel is the reasoning"),
    ReasoningFamily("GLM-4.5+", _re(r"glm[-_ ]?(?:4\.[5-9]|5)|glm[-_ ]?z1"), "glm45", "glm45",
                    vllm_also=("glm47",), exclude=_re(r"glm[-_ ]?4\.[5-9]v?[-_ ]?.*(?:ocr|embed)")),
    ReasoningFamily("MiniMax-M2", _re(r"minimax[-_ ]?m2"), "minimax", "minimax_m2",
                    sglang_also=("minimax-append-think",), vllm_also=("minimax_m2_append_think",),
                    note="vLLM's docs suggest minimax_m2_append_think (keeps <think> for interleaved thinking)"),
    ReasoningFamily("Step-3.5", _re(r"step[-_ ]?3[._]5"), "step3p5", "step3p5"),
    ReasoningFamily("Step-3", _re(r"step[-_ ]?3\b"), "step3", "step3"),
    ReasoningFamily("MiMo", _re(r"\bmimo"), "mimo", "mimo"),
    ReasoningFamily("Magistral", _re(r"magistral"), "mistral", "mistral"),
    ReasoningFamily("Nemotron 3", _re(r"nemotron[-_ ]?(?:3|nano[-_ ]?3|.*v3)"), "nemotron_3", "nemotron_v3"),
    ReasoningFamily("Intern-S1", _re(r"intern[-_ ]?s1"), "interns1", None),
    ReasoningFamily("ERNIE-4.5 Thinking", _re(r"ernie[-_ ]?4\.5.*thinking"), None, "ernie45"),
    ReasoningFamily("Hunyuan-A13B", _re(r"hunyuan[-_ ]?a13b"), None, "hunyuan_a13b"),
    ReasoningFamily("Seed-OSS", _re(r"seed[-_ ]?oss"), None, "seed_oss"),
    ReasoningFamily("OLMo-3 Think", _re(r"olmo[-_ ]?3.*think"), None, "olmo3"),
    ReasoningFamily("Granite 3.2", _re(r"granite[-_ ]?3\.2"), None, "granite", thinks_by_default=False,
                    note="thinks when the request sets chat_template_kwargs thinking=true"),
]


def family_of(*models: object) -> ReasoningFamily | None:
    """The reasoning family of the first of `models` (ids, paths, served names) that names one; None if none.
    Values that are not strings (a missing config field) are passed over."""
    for model in models:
        if not isinstance(model, str) or not model:
            continue
        for family in FAMILIES:
            if family.matches(model):
                return family
    return None


# By EngineAdapter.reasoning_kind: an adapter names whose reasoning-parser flags it takes.
ENGINE_TITLES = {"sglang": "SGLang", "vllm": "vLLM", "llamacpp": "llama.cpp"}


def fix_for(engine: str | None, family: ReasoningFamily | None) -> str:
    """How to start `engine` so the family's thinking arrives in its own field, e.g. "SGLang: start it with
    --reasoning-parser kimi_k2". Every engine's fix when the engine is not known."""
    kinds = [engine] if engine in ENGINE_TITLES else list(ENGINE_TITLES)
    parts = [_one_fix(kind, family) for kind in kinds]
    return "; ".join(parts)


def _one_fix(kind: str, family: ReasoningFamily | None) -> str:
    title = ENGINE_TITLES[kind]
    if kind == "llamacpp":
        return f"{title}: --reasoning-format {LLAMACPP_FORMAT} (not none), with --jinja"
    parser = family.parser_for(kind) if family else None
    if family is None:
        return f"{title}: --reasoning-parser NAME (the model's family: see its model card)"
    if parser is None:
        return f"{title}: registers no reasoning parser for {family.name}"
    return f"{title}: start it with --reasoning-parser {parser}"


def parser_lint(engine: str, models: list[object], parser: str | None, source: str) -> LintFinding | None:
    """The lint finding for a known reasoning family served without the parser its engine names (serious when the
    family thinks by default: TTFO and answer-token figures would count thinking as answer), or with a parser the
    engine registers for another family (warn). None when the model is not a known family or all is well.
    `engine` is 'sglang' or 'vllm'; `source` says where the parser setting was read ("command line", ...)."""
    family = family_of(*models)
    if family is None:
        return None
    model = next(m for m in models if isinstance(m, str) and m and family.matches(m))
    expected = family.parser_for(engine)
    title = ENGINE_TITLES[engine]
    if parser in (None, "", "None", "none"):
        if expected is None:
            return finding("--reasoning-parser", "warn",
                           f"{model!r} is {family.name}, a reasoning model, and {title} registers no reasoning "
                           f"parser for it: its thinking arrives in content [{source}]")
        severity = "serious" if family.thinks_by_default else "warn"
        when = "" if family.thinks_by_default else " whenever a request turns thinking on"
        return finding("--reasoning-parser", severity,
                       f"{model!r} is {family.name}, a reasoning model, served without a reasoning parser: its "
                       f"thinking arrives in content{when}, so TTFO and answer-token figures count thinking as "
                       f"answer; start it with --reasoning-parser {expected} [{source}]")
    if expected is not None and not family.accepts(engine, parser):
        return finding("--reasoning-parser", "warn",
                       f"--reasoning-parser {parser} for {model!r} ({family.name}): {title} names "
                       f"{expected} for this family [{source}]")
    return None
