"""Filler text whose length in tokens is known exactly: words that are one token each for the served model.

A synthetic prompt is `OPENER` followed by k words, each " word" one token. With a tokenizer that splits on
spaces before merging (GPT-2 style BPE, Llama 3, Qwen, SmolLM) the prompt is then exactly
overhead + k tokens, where overhead is the templated opener alone. The words are checked against the server's
own tokenizer before use, and the sum is checked on sample prompts (synthetic.py) and on every request after the
run (`usage.prompt_tokens`, bench/metrics.py), so a tokenizer that breaks the assumption is caught, not trusted.
"""

from __future__ import annotations

import random

from servelab.bench.workloads.prompt_tokens import PromptTokenCounter
from servelab.errors import UserError

OPENER = "Continue this list of words:"

# Common English words: one token each (with a leading space) in every BPE vocabulary we have looked at. Each is
# checked against the served model's tokenizer anyway; the ones that are not single tokens there are dropped.
CANDIDATES = (
    "the of and to in is it that was for on are with as his they be at one have this from or had by word but "
    "what some we can out other were all there when up use your how said an each she which do their time if "
    "will way about many then them write would like so these her long make thing see him two has look more day "
    "could go come did number sound no most people my over know water than call first who may down side been "
    "now find any new work part take get place made live where after back little only round man year came show "
    "every good me give our under name very through just form great think say help low line turn cause much "
    "mean before move right boy old too same tell does set three want air well also play small end put home read "
    "hand port large spell add even land here must big high such follow act why ask men change went light kind "
    "off need house picture try us again animal point mother world near build self earth father head stand own "
    "page should country found answer school grow study still learn plant cover food sun four thought let keep "
    "eye never last door between city tree cross since hard start might story saw far sea draw left late run "
    "while press close night real life few stop open seem together next white children begin got walk example "
    "ease paper often always music those both mark book letter until mile river car feet care second group carry "
    "took rain eat room friend began idea fish mountain north once base hear horse cut sure watch color face wood "
    "main enough plain girl usual young ready above ever red list though feel talk bird soon body dog family "
    "direct pose leave song measure state product black short numeral class wind question happen complete ship "
    "area half rock order fire south problem piece told knew pass farm top whole king size heard best hour better "
    "true during hundred am remember step early hold west ground interest reach fast five sing listen six table "
    "travel less morning ten simple several vowel toward war lay against pattern slow center love person money "
    "serve appear road map science rule govern pull cold notice voice fall power town fine certain fly unit lead "
    "cry dark machine note wait plan figure star box noun field rest correct able pound done beauty drive stood "
    "contain front teach week final gave green oh quick develop sleep warm free minute strong special mind behind "
    "clear tail produce fact street inch lot nothing course stay wheel full force blue object decide surface deep "
    "moon island foot yet busy test record boat common gold possible plane age dry wonder laugh thousand ago ran "
    "check game shape yes hot miss brought heat snow bed bring sit perhaps fill east weight language among"
).split()
MIN_WORDS = 32  # fewer single-token words than this and prompts would repeat too much to defeat prefix caching


async def single_token_words(counter: PromptTokenCounter, candidates: tuple[str, ...] | list[str] = CANDIDATES
                             ) -> list[str]:
    """The candidates that add exactly one token after OPENER, found with few count requests: a group whose
    words add as many tokens as it has words is accepted whole; otherwise it is halved until the culprits show."""
    base = await counter.count_prompt_tokens(OPENER)

    async def check(words: list[str]) -> list[str]:
        added = await counter.count_prompt_tokens(OPENER + "".join(" " + w for w in words)) - base
        if added == len(words):
            return words
        if len(words) == 1:
            return []
        mid = len(words) // 2
        return await check(words[:mid]) + await check(words[mid:])

    words = await check(list(dict.fromkeys(candidates)))
    if len(words) < MIN_WORDS:
        raise UserError(f"only {len(words)} of {len(candidates)} filler words are single tokens for this model's "
                        f"tokenizer ({counter.name}): exact synthetic lengths are not possible",
                        hint="use a dataset (--dataset) instead of synthetic prompts")
    return words


def filler(words: list[str], rng: random.Random, n: int) -> str:
    """n filler words, each with its leading space."""
    return "".join(" " + rng.choice(words) for _ in range(n))
