"""Chat with images side by side: each run's single-stream requests by image count and size
(docs/metrics.md#images), one row per group any run sent, so what an image costs in prefill on each server reads
across a row.

The groups are descriptive: they carry no interval and no verdict. The comparison's verdict on images is its
`single.ttft_image_ms` row (compare/metrics.py), read from the same level; a group holds few requests, often one
size per group, and judging each one would multiply the verdicts a comparison claims.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from servelab.compare.metrics import single_level
from servelab.compare.run_data import RunData


class ImageGroupCell(BaseModel):
    """One run's requests of one group."""

    requests: int  # successful ones
    failed: int = 0
    ttft_ms_p50: float | None = None
    prompt_tokens_mean: float | None = None  # the server's usage.prompt_tokens, images included


class ImageGroupRow(BaseModel):
    images: int  # images per request (0: requests without images)
    sizes: str | None = None  # each image's "WxH", comma-separated (None: grouped by image count alone)
    # pixels per request, in millions; None where runs grouped by image count alone disagree on the mean
    megapixels: float | None = None
    runs: list[ImageGroupCell | None] = Field(default_factory=list)  # one per run, the baseline first; None: none


def image_group_rows(runs: list[RunData]) -> list[ImageGroupRow]:
    """The single-stream level's image groups of every run, matched by image count and sizes; [] when no run's
    single-stream level sent images."""
    levels = [single_level(run) for run in runs]
    per_run = [{(g.images, g.sizes): g for g in (level.images if level is not None else [])} for level in levels]
    keys: dict[tuple[int, str | None], float] = {}
    for groups in per_run:
        for key, g in groups.items():
            keys.setdefault(key, g.megapixels if g.megapixels is not None else float("inf"))
    if not any(images > 0 for images, _ in keys):
        return []
    rows = []
    for key in sorted(keys, key=lambda k: (k[0], keys[k], k[1] or "")):  # as the levels order them
        found = [groups.get(key) for groups in per_run]
        pixels = {g.megapixels for g in found if g is not None}
        rows.append(ImageGroupRow(
            images=key[0], sizes=key[1], megapixels=pixels.pop() if len(pixels) == 1 else None,
            runs=[None if g is None else ImageGroupCell(
                requests=g.requests, failed=g.failed, ttft_ms_p50=g.ttft_ms.p50 if g.ttft_ms else None,
                prompt_tokens_mean=g.prompt_tokens_mean) for g in found]))
    return rows
