"""servelab's embedded-engine launcher (servelab.engines.llamacpp_server) with llama-server's `--embeddings
--pooling mean` set (or, with `--reranking`, rank pooling), for tests/test_verify_endpoints.py and
tests/test_bench_unary.py: the launcher has no such flags, and SmolLM2 declares no pooling of its own (llama.cpp then refuses OpenAI embeddings: "Pooling type 'none' is not OAI compatible").
Every other flag is the launcher's own: `python tests/llamacpp_pooled_server.py --model X --port P ...`."""

from __future__ import annotations

import sys

import xllamacpp

from servelab.engines import llamacpp_server

_plain_params = xllamacpp.CommonParams


def pooled_params(pooling: str = "MEAN") -> xllamacpp.CommonParams:
    params = _plain_params()
    params.embedding = True
    params.pooling_type = getattr(xllamacpp.llama_pooling_type, f"LLAMA_POOLING_TYPE_{pooling}")
    return params


if __name__ == "__main__":
    # --reranking, as llama-server's flag: rank pooling, which serves /v1/rerank and /rerank (not embeddings). SmolLM2
    # has no classification head; llama.cpp then scores with its output layer: the scores are not a reranker's, the
    # interface is the real one (tests/test_bench_unary.py).
    pooling = "RANK" if "--reranking" in sys.argv else "MEAN"
    sys.argv = [a for a in sys.argv if a != "--reranking"]
    xllamacpp.CommonParams = lambda: pooled_params(pooling)  # the launcher builds its parameters from this name
    sys.exit(llamacpp_server.main())
