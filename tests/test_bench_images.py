"""Chat with images against a real llama.cpp vision server: the embedded launcher with SmolLM2 and a tiny
mmproj built here (tests/tiny_mmproj.py: llama.cpp's own mtmd code decodes each PNG, runs a seeded-noise vision
tower and splices IMAGE_TOKENS embeddings per image into the prompt). The bench sends images, records them, and
its figures split by image count and size; the prompt tokens the server's usage reports grow by the same amount
per image. The same bench against the plain embedded server (no mmproj) fails in one line, in llama.cpp's words."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from rich.console import Console

from servelab.bench.image_figures import ImageRow, image_figures
from servelab.bench.metrics import summarize
from servelab.bench.options import BenchArgs, build_options
from servelab.bench.runner import bench
from servelab.bench.tally import LevelTally
from servelab.bench.trials import pool_level
from servelab.bench.workloads.images import ImageFiles, SyntheticImages, image_size, parse_sizes, png_bytes
from servelab.errors import UserError
from servelab.models import resolve_model
from servelab.records import RequestRecord, TokenEvent, Usage
from servelab.report.terminal import render_images
from servelab.verify.runner import verify
from tests.conftest import embedded_argv, running_engine
from tests.png import read_png
from tests.tiny_mmproj import IMAGE_TOKENS, build

pytestmark = pytest.mark.engine
VERIFY_TIMEOUT_S = 120.0  # a busy 2-core box: the check takes seconds, the deadline is for the box's load


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory):
    """The embedded launcher with --mmproj (the tiny projector) and --media-path (for file:// URLs)."""
    root = tmp_path_factory.mktemp("vision")
    mmproj = build(root / "tiny-mmproj.gguf")
    media = root / "media"
    media.mkdir()
    log = root / "engine.log"
    with running_engine(embedded_argv("--ctx-size", "4096", "--mmproj", str(mmproj), "--media-path", str(media),
                                      parallel=2), log) as url:
        assert "loaded multimodal model" in log.read_text(errors="replace")
        yield {"url": url, "model": resolve_model("smollm2").served_name, "media": media}


def _bench(url: str, **args):
    records = []
    opts = build_options(BenchArgs(mode="single", max_tokens=2, warmup=0, **{"tokenizer": "none", **args}))
    result = bench(url, opts, on_record=records.append)
    return result, records


def _tokenize(url: str, text: str) -> list[int]:
    request = urllib.request.Request(url + "/tokenize", data=json.dumps({"content": text}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)["tokens"]


# ---- the images themselves -------------------------------------------------------------------------------------


def test_synthetic_pngs_decode_to_their_pixels_and_are_distinct_and_deterministic() -> None:
    rows = bytes(range(192)) * 4  # 4 rows of 64 RGB pixels
    width, height, decoded = read_png_bytes(png_bytes(64, 4, rows))
    assert (width, height) == (64, 4) and b"".join(decoded) == rows
    images = SyntheticImages("7:")
    a, b = images.png(32, 16, "1-0"), images.png(32, 16, "1-1")
    assert a != b and a == SyntheticImages("7:").png(32, 16, "1-0")
    assert image_size(a) == (32, 16) and read_png_bytes(a)[:2] == (32, 16)


def test_two_synthetic_images_differ_in_every_row_and_after_a_center_crop() -> None:
    images = SyntheticImages("0:t1-single")
    width, height = 336, 448  # CLIP-style: shortest edge 336, then a 336x336 center crop drops 56 rows each end
    first, second = (read_png_bytes(images.png(width, height, name))[2] for name in ("0-0", "1-0"))
    assert all(a != b for a, b in zip(first, second, strict=True))
    top, left = (height - 224) // 2, (width - 224) // 2 * 3  # a 224x224 center crop: rows and columns cut
    crop = [(a[left:left + 224 * 3], b[left:left + 224 * 3]) for a, b in zip(first[top:top + 224],
                                                                               second[top:top + 224])]
    assert all(a != b for a, b in crop)
    assert len(set(first)) == height  # and each image is noise, not one row repeated


def test_every_image_size_is_built_in_prepare_not_in_the_send_path() -> None:
    import asyncio

    workload = build_options(BenchArgs(images="1", image_size="64x32,16x16")).workload
    asyncio.run(workload.prepare(None))
    assert set(workload.images._fields) == {(64, 32), (16, 16)}  # the send path only reads what is there


def test_an_open_loop_level_builds_image_requests_ahead_only_up_to_its_byte_budget(monkeypatch) -> None:
    """Synthetic images make every body megabytes of its own: past PREBUILD_BYTES the schedule's requests are built
    as they fall due, so a long level of large images does not hold them all in memory before it starts."""
    import asyncio
    import time

    from servelab.bench.client import StreamClient
    from servelab.bench.loads import Recorder, Target, open_loop, run_rate
    from servelab.calibration import Script, start_calibration_server

    workload = build_options(BenchArgs(images="1", image_size="64x64", max_tokens=4)).workload
    asyncio.run(workload.prepare(None))
    one = workload.request(0, "m").own_bytes
    assert one == len(workload.images.data_url(64, 64, "x")) > 64 * 64 * 3 * 4 // 3  # a data URL's base64
    built: list[int] = []

    class Timed:  # the image workload, each request's build time noted
        def __getattr__(self, name):
            return getattr(workload, name)

        def request(self, *args, **kwargs):
            built.append(time.perf_counter_ns())
            return workload.request(*args, **kwargs)

    monkeypatch.setattr(open_loop, "PREBUILD_BYTES", 3 * one)

    async def go():
        async with StreamClient(cal.url) as client:
            return await run_rate(client, Timed(), Target(model="calibration"), Recorder(), rate=50,
                                  arrival="constant", requests=8)

    with start_calibration_server(Script(ttft_ms=1, itl_ms=1, output_tokens=2)) as cal:
        records, _ = asyncio.run(go())
    assert len(records) == 8 and all(r.ok and r.images == 1 for r in records)
    first_send = min(r.t_send_ns for r in records)
    assert sum(t < first_send for t in built) == 3  # three bodies of `one` bytes reach the budget
    sends = sorted(r.t_send_ns for r in records)
    assert all(sends[k - 1] < built[k] for k in range(3, 8))  # the rest, one by one as each fell due


def test_file_urls_are_written_ahead_of_the_request_and_removed_when_the_bench_ends(tmp_path) -> None:
    workload = build_options(BenchArgs(images="0,2", image_size="16x16", image_url="file",
                                       image_dir=str(tmp_path))).workload
    first = workload.request(1, "m")
    urls = [p["image_url"]["url"] for p in first.body["messages"][-1]["content"][1:]]
    assert len(urls) == 2 and all(u.startswith("file://servelab-") for u in urls)
    workload.files._writer.shutdown(wait=True)  # let the writer finish what it has ahead
    on_disk = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert {u.removeprefix("file://") for u in urls} <= set(on_disk)
    assert len(on_disk) == 2 * (1 + ImageFiles.AHEAD // 2)  # this request's and the next ones', each only once
    assert all(read_png_bytes(data)[:2] == (16, 16) for data in on_disk.values())
    workload.close()
    assert list(tmp_path.iterdir()) == []


def read_png_bytes(data: bytes, tmp=Path(os.environ.get("TMPDIR", "/tmp"))):
    path = tmp / f"servelab-png-{os.getpid()}.png"
    path.write_bytes(data)
    try:
        return read_png(path)
    finally:
        path.unlink()


def test_jpeg_and_gif_headers_give_their_size() -> None:
    jpeg = (b"\xff\xd8" + b"\xff\xe0" + (16).to_bytes(2, "big") + b"JFIF\0" + b"\0" * 9
            + b"\xff\xc0" + (17).to_bytes(2, "big") + b"\x08" + (480).to_bytes(2, "big") + (640).to_bytes(2, "big")
            + b"\x03" + b"\0" * 9)
    assert image_size(jpeg) == (640, 480)
    assert image_size(b"GIF89a" + (300).to_bytes(2, "little") + (200).to_bytes(2, "little")) == (300, 200)
    assert image_size(b"not an image") is None


def test_image_options_are_checked_in_one_line() -> None:
    for args, words in ((dict(images="65"), "between 0 and 64"), (dict(images="x"), "bad --images"),
                        (dict(images="1", image_size="10"), "width x height"),
                        (dict(image_size="64x64"), "add --images"),
                        (dict(images="1", image_url="file"), "--image-dir"),
                        (dict(images="1", endpoint="completions"), "--endpoint chat"),
                        (dict(images="1", mode="multiturn"), "single-turn")):
        with pytest.raises(UserError, match=words):
            build_options(BenchArgs(**args))
    assert parse_sizes("224x224,1024x768") == [(224, 224), (1024, 768)]


# ---- the figures, from rows ------------------------------------------------------------------------------------


def test_image_figures_split_by_count_and_size_and_are_absent_without_images() -> None:
    rows = [ImageRow(0, 0, 10.0, 30), ImageRow(1, 50_176, 40.0, 108), ImageRow(1, 50_176, 44.0, 108),
            ImageRow(2, 2 * 786_432, 90.0, 186)]
    figures, groups = image_figures(rows)
    assert figures["images_per_request"].value == 1.0
    assert figures["image_megapixels"].value == pytest.approx((0 + 2 * 0.050176 + 1.572864) / 4)
    assert figures["ttft_image_ms"].value == 44.0 and figures["ttft_text_ms"].value == 10.0
    assert [(g.images, g.megapixels, g.requests, g.prompt_tokens_mean) for g in groups] == [
        (0, 0.0, 1, 30.0), (1, 0.050176, 2, 108.0), (2, 1.572864, 1, 186.0)]
    assert groups[1].ttft_ms.p50 == 42.0
    assert image_figures([ImageRow(0, 0, 10.0, 30)]) == ({}, [])  # no image in the level: no image figure
    only_images, _ = image_figures([ImageRow(1, 4, 5.0, 9)])
    assert "ttft_text_ms" not in only_images


def test_image_groups_keep_sizes_of_equal_pixels_apart_and_count_failed_requests() -> None:
    wide, tall = 1024 * 768, 768 * 1024
    rows = [ImageRow(1, wide, 40.0, 300, "1024x768"), ImageRow(1, tall, 60.0, 320, "768x1024"),
            ImageRow(1, tall, 62.0, 320, "768x1024"), ImageRow(1, wide, None, None, "1024x768", ok=False),
            ImageRow(0, 0, 10.0, 30, "")]
    figures, groups = image_figures(rows)
    assert [(g.images, g.sizes, g.requests, g.failed, g.prompt_tokens_mean) for g in groups] == [
        (0, "", 1, 0, 30.0), (1, "1024x768", 1, 1, 300.0), (1, "768x1024", 2, 0, 320.0)]
    assert groups[2].ttft_ms.p50 == 61.0 and groups[1].megapixels == pytest.approx(0.786432)
    assert figures["images_per_request"].dist.n == 4  # the figures are over successful requests only
    console = Console(record=True, width=140, color_system=None)
    render_images(console, [summary_with(groups)])
    lines = console.export_text().splitlines()
    row = next(line for line in lines if "1024x768" in line).split("│")
    assert [cell.strip() for cell in row[1:6]] == ["1", "1024x768", "0.786", "1", "1"]  # images, sizes, MP, ok, failed
    assert any("768x1024" in line for line in lines)


def summary_with(groups):
    from servelab.records import Summary

    return Summary(tag="c1", mode="concurrency", concurrency=1, window_s=1.0, requests=5, ok=4, failed=1,
                   images=groups)


# ---- against the real vision server ------------------------------------------------------------------------------


def test_bench_sends_images_and_the_servers_prompt_grows_by_one_images_tokens_per_image(vision_server) -> None:
    # prompts of exactly 48 tokens after the chat template (the server's /tokenize), so only images differ
    result, records = _bench(vision_server["url"], requests=6, images="0,1,2", image_size="224x224,64x48",
                             input_tokens="48", tokenizer="auto")
    (level,) = result.levels
    assert level.ok == 6 and level.failed == 0
    shapes = sorted((r.images, r.image_pixels) for r in records)
    assert shapes == [(0, 0), (0, 0), (1, 64 * 48), (1, 224 * 224), (2, 2 * 64 * 48), (2, 2 * 224 * 224)]
    # the server's own count: a fixed-size projector costs the same tokens whatever the image's size
    by_count = {}
    for r in records:
        by_count.setdefault(r.images, set()).add(r.usage.prompt_tokens)
    assert all(len(v) == 1 for v in by_count.values()), by_count
    text, one, two = (by_count[k].pop() for k in (0, 1, 2))
    assert text == 48
    # ground truth: the projector's embeddings, and the text llama.cpp wraps a gemma3 image in, by its tokenizer
    wrapper = sum(len(_tokenize(vision_server["url"], t)) for t in ("<start_of_image>", "<end_of_image>"))
    assert one - text == two - one == IMAGE_TOKENS + wrapper, (text, one, two, wrapper)
    # figures: groups by count and pixels, their prompt tokens the records' own
    assert [(g.images, g.sizes, g.megapixels, g.requests, g.failed) for g in level.images] == [
        (0, "", 0.0, 2, 0), (1, "64x48", 0.003072, 1, 0), (1, "224x224", 0.050176, 1, 0),
        (2, "64x48,64x48", 0.006144, 1, 0), (2, "224x224,224x224", 0.100352, 1, 0)]
    assert [g.prompt_tokens_mean for g in level.images] == [text, one, one, two, two]
    assert level.figures["images_per_request"].value == 1.0
    assert level.figures["ttft_image_ms"].dist.n == 4 and level.figures["ttft_text_ms"].dist.n == 2
    assert result.workload["kind"] == "images" and result.workload["image_sizes"] == ["224x224", "64x48"]
    console = Console(record=True, width=120)
    render_images(console, result.levels)
    table = console.export_text()
    assert "single: by image count and size" in table and f"│ 2      │ 2 × 224x224 │   0.100 │  1 │      0 │ {two:>6} │" in table


def test_a_text_bench_has_no_image_figures(vision_server) -> None:
    result, records = _bench(vision_server["url"], requests=2)
    (level,) = result.levels
    assert level.ok == 2 and level.images == [] and all(r.images is None for r in records)
    assert not {"images_per_request", "image_megapixels", "ttft_image_ms", "ttft_text_ms"} & set(level.figures)
    console = Console(record=True, width=120)
    render_images(console, result.levels)
    assert console.export_text() == ""


def test_file_urls_name_images_in_the_servers_media_path(vision_server) -> None:
    media: Path = vision_server["media"]
    result, records = _bench(vision_server["url"], requests=2, images="1", image_size="32x32", image_url="file",
                             image_dir=media)
    assert result.levels[0].ok == 2, result.levels[0].top_errors
    assert records[0].usage.prompt_tokens > IMAGE_TOKENS  # the server read the file
    assert list(media.iterdir()) == []  # and the bench removed it: the directory does not grow run after run


def test_a_datasets_lines_bring_their_own_images(vision_server, tmp_path) -> None:
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.png").write_bytes(SyntheticImages("d").png(40, 30, "a"))
    (tmp_path / "pics" / "b.png").write_bytes(SyntheticImages("d").png(20, 10, "b"))
    lines = [{"prompt": "What is this?", "images": ["pics/a.png"]},
             {"prompt": "Compare these.", "images": ["pics/a.png", "pics/b.png"]}]
    path = tmp_path / "vision.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result, records = _bench(vision_server["url"], requests=2, dataset=path)
    assert result.levels[0].ok == 2
    assert sorted((r.images, r.image_pixels) for r in records) == [(1, 1200), (2, 1400)]
    with pytest.raises(UserError, match="their own images"):
        build_options(BenchArgs(dataset=path, images="1"))


def test_without_a_vision_model_every_request_fails_in_llamacpps_words(embedded_server) -> None:
    result, records = _bench(embedded_server["url"], requests=2, images="1", image_size="32x32")
    (level,) = result.levels
    assert level.ok == 0 and level.failed == 2
    (top,) = level.top_errors
    assert top.status == 500 and "image input is not supported" in top.detail
    assert "mmproj" in top.detail


def test_bench_cli_without_a_vision_model_says_so_in_one_line(embedded_server, tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "servelab.cli", "bench", embedded_server["url"], "--requests", "1",
                          "--max-tokens", "2", "--warmup", "0", "--images", "1", "--image-size", "16x16"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    both = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in both
    assert "image input is not supported" in both, both


def test_verify_images_passes_with_a_vision_model_and_skips_without(vision_server, embedded_server) -> None:
    (check,) = [c for c in verify(vision_server["url"], only=["images"], check_timeout_s=VERIFY_TIMEOUT_S).checks
                if c.id == "images"]
    assert check.outcome == "pass", check.reason
    assert "prompt tokens" in check.reason
    (plain,) = [c for c in verify(embedded_server["url"], only=["images"], check_timeout_s=VERIFY_TIMEOUT_S).checks
                if c.id == "images"]
    assert plain.outcome == "skip" and plain.reason.startswith("the server has no vision model loaded")
    assert "mmproj" in plain.reason


def test_image_groups_pool_over_every_trials_requests() -> None:
    ms, t0 = 1_000_000, 10**12

    def record(trial: int, i: int, images: int) -> RequestRecord:
        send = t0 + (trial * 100 + i) * 1_000 * ms
        events = [TokenEvent(t_ns=send + (10 + 40 * images + k) * ms, kind="answer", tokens=1, text="x")
                  for k in range(2)]
        return RequestRecord(index=i, trial=trial, tag="c1", endpoint="/v1/chat/completions", t_send_ns=send,
                             t_end_ns=events[-1].t_ns + ms, events=events, count_method="server_per_chunk", ok=True,
                             saw_done=True, images=images, image_pixels=images * 50_176,
                             usage=Usage(prompt_tokens=30 + 30 * images, completion_tokens=2))

    trials = [[record(trial, i, i % 2) for i in range(4)] for trial in (0, 1)]
    levels = [summarize(rs, tag="c1", mode="concurrency", concurrency=1, window=(rs[0].t_send_ns, rs[-1].t_end_ns))
              for rs in trials]
    pooled = pool_level(levels, LevelTally.from_records([r for rs in trials for r in rs]), [0, 1])
    assert [(g.images, g.requests, g.prompt_tokens_mean) for g in pooled.images] == [(0, 4, 30.0), (1, 4, 60.0)]
    assert pooled.images[1].ttft_ms.p50 == 50.0 and pooled.figures["ttft_text_ms"].value == 10.0
    assert pooled.figures["images_per_request"].dist.n == 8


def test_compare_sets_the_ttft_of_requests_with_images_side_by_side_and_a_run_without_says_why(tmp_path) -> None:
    import servelab.api
    from servelab.compare.compare import compare_runs
    from servelab.compare.sources import load_run_dir
    from tests.openai_fake import FakeOpenAI, serving

    with serving(FakeOpenAI().app()) as url:
        runs = [servelab.api.bench(url, mode="single", max_tokens=4, warmup=0, tokenizer="none", requests=4,
                                   out=tmp_path / name, **extra)
                for name, extra in (("images", {"images": "0,1"}), ("plain", {}))]
    comparison = compare_runs([load_run_dir(run.run_dir) for run in runs])
    row = next(r for r in comparison.rows if r.key == "single.ttft_image_ms")
    with_images, plain = row.figures[:2]
    assert with_images.value == runs[0].result.levels[0].figures["ttft_image_ms"].value
    assert plain.value is None


def test_each_trial_sends_images_of_its_own() -> None:
    from servelab.pipeline import in_series

    workload = build_options(BenchArgs(images="1", image_size="8x8")).workload
    first, second = (in_series(workload, trial, "single").request(0, "m") for trial in (1, 2))
    (text_1, image_1), (text_2, image_2) = (r.body["messages"][-1]["content"] for r in (first, second))
    assert text_1 != text_2 and image_1 != image_2  # neither a prefix cache nor an image cache carries over
    assert in_series(workload, 1, "single").request(0, "m").body == first.body  # and each is deterministic
