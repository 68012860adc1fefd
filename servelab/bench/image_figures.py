"""Chat-with-images figures of one load level, as a pure function of small per-request rows
(docs/metrics.md#images).

A row is what one finished request of an image workload (bench/workloads/images.py) tells: how many images it
carried, their sizes and pixels summed, whether it succeeded, its TTFT and the prompt the server counted
(`usage.prompt_tokens`, which holds the images' tokens). The level's tally builds one row per such request as it is
folded (bench/tally.py; a failed request's row only counts as failed in its group); requests of other workloads
make none, so a level without images has none of these figures (absent, never 0).

Figures:
- images_per_request: images per request (headline: the mean);
- image_megapixels: pixels per request, summed over its images, in millions (headline: the mean), over the
  requests whose images' sizes are known;
- ttft_image_ms / ttft_text_ms: TTFT of the requests with at least one image / with none, so the prefill the
  images cost shows apart from the text-only requests of the same level (each only when the level has such
  requests).
Per image count and sizes (ImageGroupFigures; 1024x768 and 768x1024 are two groups, though their pixels are equal):
successful and failed requests, TTFT distribution and mean prompt tokens; at most MAX_GROUPS groups, beyond which
the groups are by image count alone (a dataset of many sizes).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import NamedTuple

from servelab.bench.figures import FIGURES
from servelab.bench.sketch import distribution
from servelab.records import Figure, ImageGroupFigures, RequestRecord

MAX_GROUPS = 32


class ImageRow(NamedTuple):
    images: int
    pixels: int | None  # summed over the request's images; None when some image's size is unknown
    ttft_ms: float | None
    prompt_tokens: int | None  # the server's usage.prompt_tokens
    sizes: str | None = None  # each image's "WxH", comma-separated (records before sizes were kept: None)
    ok: bool = True  # a failed request's row counts in its group's `failed`, in no figure


def image_row(r: RequestRecord, ttft_ms: float | None) -> ImageRow | None:
    """The row of a finished request (failed ones too), or None for a request of a workload without images."""
    if r.images is None:
        return None
    prompt = r.usage.prompt_tokens if r.usage is not None else None
    return ImageRow(r.images, r.image_pixels, ttft_ms, prompt, r.image_sizes, r.ok)


def image_figures(rows: Iterable[ImageRow]) -> tuple[dict[str, Figure], list[ImageGroupFigures]]:
    """(figures, groups); both empty when no row carried an image."""
    every = list(rows)
    rows = [r for r in every if r.ok]
    if not any(r.images > 0 for r in every):
        return {}, []
    figures: dict[str, Figure] = {}
    counts = distribution([float(r.images) for r in rows])
    figures["images_per_request"] = FIGURES["images_per_request"].make(counts.mean if counts else None,
                                                                       dist=counts)
    known = [r.pixels / 1e6 for r in rows if r.pixels is not None]
    if known:
        mp = distribution(known)
        note = None if len(known) == len(rows) else f"{len(known)} of {len(rows)} requests' image sizes known"
        figures["image_megapixels"] = FIGURES["image_megapixels"].make(mp.mean if mp else None, dist=mp, note=note)
    for key, with_images in (("ttft_image_ms", True), ("ttft_text_ms", False)):
        ttfts = [r.ttft_ms for r in rows if (r.images > 0) == with_images and r.ttft_ms is not None]
        if ttfts:
            dist = distribution(ttfts)
            figures[key] = FIGURES[key].make(dist.p50 if dist else None, dist=dist,
                                             note="requests with at least one image" if with_images
                                             else "requests without images, at the same load")
    return figures, image_groups(every)


def _shape(r: ImageRow) -> tuple[int, str | None, int | None]:
    """A group's key: the image count and the sizes (pixels alone merge 1024x768 with 768x1024); the pixel total
    where sizes were not kept."""
    return (r.images, r.sizes, None if r.sizes is not None else r.pixels)


def image_groups(rows: list[ImageRow]) -> list[ImageGroupFigures]:
    by_shape: dict[tuple[int, str | None, int | None], list[ImageRow]] = defaultdict(list)
    for r in rows:
        by_shape[_shape(r)].append(r)
    by_count = len(by_shape) > MAX_GROUPS  # too many sizes to read: by image count alone, mean megapixels
    if by_count:
        counted: dict[tuple[int, str | None, int | None], list[ImageRow]] = defaultdict(list)
        for r in rows:
            counted[(r.images, None, None)].append(r)
        by_shape = counted
    groups = []
    for (images, sizes, _), members in sorted(by_shape.items(), key=lambda kv: (kv[0][0], _pixels_of(kv[1]),
                                                                                  kv[0][1] or "")):
        ok = [m for m in members if m.ok]
        known = [m.pixels for m in members if m.pixels is not None]
        mp = sum(known) / len(known) / 1e6 if known else None
        prompts = [m.prompt_tokens for m in ok if m.prompt_tokens is not None]
        groups.append(ImageGroupFigures(
            images=images, sizes=sizes, megapixels=mp, requests=len(ok), failed=len(members) - len(ok),
            ttft_ms=distribution([m.ttft_ms for m in ok if m.ttft_ms is not None]),
            prompt_tokens_mean=sum(prompts) / len(prompts) if prompts else None))
    return groups


def _pixels_of(members: list[ImageRow]) -> int:
    known = [m.pixels for m in members if m.pixels is not None]
    return sum(known) // len(known) if known else 0
