"""servelab's embedded-engine launcher (servelab.engines.llamacpp_server) with llama-server's `--embeddings
--pooling mean` set, for tests/test_verify_endpoints.py: the launcher has no such flags, and SmolLM2 declares no
pooling of its own (llama.cpp then refuses OpenAI embeddings: "Pooling type 'none' is not OAI compatible").
Every other flag is the launcher's own: `python tests/llamacpp_pooled_server.py --model X --port P ...`."""

from __future__ import annotations

import sys

import xllamacpp

from servelab.engines import llamacpp_server

_plain_params = xllamacpp.CommonParams


def pooled_params() -> xllamacpp.CommonParams:
    params = _plain_params()
    params.embedding = True
    params.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    return params


if __name__ == "__main__":
    xllamacpp.CommonParams = pooled_params  # the launcher builds its parameters from this name
    sys.exit(llamacpp_server.main())
