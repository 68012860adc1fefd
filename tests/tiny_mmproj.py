"""A tiny llama.cpp vision projector (mmproj GGUF) for SmolLM2-135M, written here in pure Python.

No package ships a small vision GGUF with its mmproj, and `globalmm` (which builds mmproj files for any LLM) needs
SigLIP SO400M and COCO from the Hugging Face hub. So the tests build the smallest file llama.cpp's real `mtmd`
code accepts: a SigLIP-shaped vision tower (patch embedding, one transformer block, post-norm) behind the gemma3
projector (average pool, RMS norm, one matrix into the LLM's 576-wide embedding space), the layout `globalmm`
writes. Its weights are seeded noise, so it cannot say what is in a picture; everything else is the real serving
path: llama.cpp decodes the PNG, resizes it to 224x224, runs the tower, and puts IMAGE_TOKENS embeddings per image
into the prompt, which its usage counts as prompt tokens.

Run as a script to write the file: `python tests/tiny_mmproj.py OUT.gguf`.
"""

from __future__ import annotations

import random
import struct
import sys
from array import array
from pathlib import Path

IMAGE_SIZE = 224
PATCH_SIZE = 14
POOL = 4  # the gemma3 projector's scale factor: (224/14 / 4)^2 = 16 tokens per image
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE // POOL) ** 2
TOWER_WIDTH = 64
TOWER_FFN = 128
TOWER_HEADS = 4
LLM_WIDTH = 576  # SmolLM2-135M's hidden size: the projector's output must match the LLM's embeddings

_U32, _F32, _BOOL, _STRING, _ARRAY = 4, 6, 7, 8, 9  # gguf value types
_GGML_F32 = 0
_ALIGN = 32


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _value(v) -> tuple[int, bytes]:
    if isinstance(v, bool):
        return _BOOL, struct.pack("<?", v)
    if isinstance(v, int):
        return _U32, struct.pack("<I", v)
    if isinstance(v, float):
        return _F32, struct.pack("<f", v)
    if isinstance(v, str):
        return _STRING, _string(v)
    if isinstance(v, list):  # arrays of floats only (image mean / std)
        return _ARRAY, struct.pack("<IQ", _F32, len(v)) + b"".join(struct.pack("<f", x) for x in v)
    raise TypeError(f"no gguf type for {v!r}")


def write_gguf(path: Path, metadata: dict, tensors: dict[str, tuple[tuple[int, ...], array]]) -> None:
    """GGUF v3: header, key/values, tensor infos (ggml dimension order, innermost first), aligned f32 data."""
    head = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(metadata))]
    for key, v in metadata.items():
        kind, payload = _value(v)
        head += [_string(key), struct.pack("<I", kind), payload]
    offset, blobs = 0, []
    for name, (dims, data) in tensors.items():
        assert len(data) == _product(dims), name
        head += [_string(name), struct.pack("<I", len(dims)), struct.pack(f"<{len(dims)}Q", *dims),
                 struct.pack("<IQ", _GGML_F32, offset)]
        blob = data.tobytes()
        blob += b"\0" * (-len(blob) % _ALIGN)
        blobs.append(blob)
        offset += len(blob)
    header = b"".join(head)
    header += b"\0" * (-len(header) % _ALIGN)
    path.write_bytes(header + b"".join(blobs))


def _product(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def build(path: Path, seed: int = 0) -> Path:
    """Write the mmproj to `path` (about 0.5 MB) and return it; the same seed writes the same bytes."""
    rng = random.Random(seed)

    def noise(*dims: int, scale: float = 0.02) -> tuple[tuple[int, ...], array]:
        return dims, array("f", (rng.gauss(0.0, scale) for _ in range(_product(dims))))

    def const(value: float, n: int) -> tuple[tuple[int, ...], array]:
        return (n,), array("f", [value] * n)

    d, f = TOWER_WIDTH, TOWER_FFN
    n_pos = (IMAGE_SIZE // PATCH_SIZE) ** 2
    tensors = {
        "v.patch_embd.weight": noise(PATCH_SIZE, PATCH_SIZE, 3, d),
        "v.patch_embd.bias": const(0.0, d),
        "v.position_embd.weight": noise(d, n_pos),
    }
    for name, dims in (("attn_q", (d, d)), ("attn_k", (d, d)), ("attn_v", (d, d)), ("attn_out", (d, d)),
                       ("ffn_up", (d, f)), ("ffn_down", (f, d))):
        tensors[f"v.blk.0.{name}.weight"] = noise(*dims)
        tensors[f"v.blk.0.{name}.bias"] = const(0.0, dims[1])
    for norm in ("ln1", "ln2"):
        tensors[f"v.blk.0.{norm}.weight"] = const(1.0, d)
        tensors[f"v.blk.0.{norm}.bias"] = const(0.0, d)
    tensors["v.post_ln.weight"] = const(1.0, d)
    tensors["v.post_ln.bias"] = const(0.0, d)
    tensors["mm.input_projection.weight"] = noise(LLM_WIDTH, d)
    tensors["mm.soft_emb_norm.weight"] = const(1.0, d)
    metadata = {
        "general.architecture": "clip",
        "general.name": "servelab tiny vision tower (seeded noise)",
        "clip.projector_type": "gemma3",
        "clip.has_text_encoder": False,
        "clip.has_vision_encoder": True,
        "clip.has_llava_projector": False,
        "clip.use_gelu": True,
        "clip.vision.image_size": IMAGE_SIZE,
        "clip.vision.patch_size": PATCH_SIZE,
        "clip.vision.embedding_length": d,
        "clip.vision.feed_forward_length": f,
        "clip.vision.projection_dim": LLM_WIDTH,
        "clip.vision.block_count": 1,
        "clip.vision.attention.head_count": TOWER_HEADS,
        "clip.vision.attention.layer_norm_epsilon": 1e-6,
        "clip.vision.image_mean": [0.5, 0.5, 0.5],
        "clip.vision.image_std": [0.5, 0.5, 0.5],
        "clip.vision.projector.scale_factor": POOL,
    }
    write_gguf(path, metadata, tensors)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/tiny_mmproj.py OUT.gguf")
    print(build(Path(sys.argv[1])))
