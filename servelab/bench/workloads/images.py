"""Chat with images: any text workload's requests with images added to their user message (docs/workloads.md#images).

`--images N --image-size WxH` adds N synthetic PNG images of that size to each request of the workload underneath
(the stories, `--input-tokens`, a `--dataset`); both take lists (`--images 0,1,4 --image-size 224x224,1024x768`),
and request i takes count i mod len(counts) and the size after that, so one level holds every combination and
its figures split by them (bench/image_figures.py). A JSONL dataset line may name its own images instead
(`"images": ["cat.png"]`, paths relative to the file).

Images go as content parts after the text, `{"type": "image_url", "image_url": {"url": ...}}`, the url a base64
data URL (`data:image/png;base64,...`, the default) or a file URL (`--image-url file`: written to `--image-dir`,
named `file://NAME` relative to it, as llama.cpp's `--media-path` wants; the server must see that directory). The
files are written by a thread a few requests ahead of the sender and removed when the bench ends (ImageFiles).

Every synthetic image is distinct (its pixels follow from the seed, the bench's series, the request number and
the image's place), so neither a prefix cache nor an engine's cache of encoded images (vLLM keys its own by the
image's hash) serves one request's images to another: each request pays its own image encoding, as distinct user
uploads do. Pixels are seeded noise, which no PNG compresses: an image is sent at about its raw size (W x H x 3
bytes, and a third more as base64). Two images differ in every row and column, so a processor that crops or resizes
them first (SGLang hashes the processed pixels) still sees distinct images. Written without Pillow: the PNG stores
its rows uncompressed, and all of an image but its first row is built (and base64-encoded) once per size, in
prepare, so the sender's hot path pays one row and one copy per image, not an encoding (SyntheticImages).
"""

from __future__ import annotations

import base64
import dataclasses
import random
import secrets
import struct
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.bench.client import RequestSpec
from servelab.bench.workloads.prompt_tokens import PromptTokenCounter
from servelab.errors import UserError

MAX_IMAGES = 64  # per request: more than any engine's default limit (vLLM --limit-mm-per-prompt, SGLang)
MAX_SIDE = 8192  # pixels: a 8192x8192 noise PNG is 200 MB
MAX_DATASET_IMAGE_BYTES = 1 << 30  # read from a dataset's image files, all of them together
TRANSPORTS = ("data", "file")
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
         ".webp": "image/webp", ".bmp": "image/bmp"}


def parse_counts(text: str) -> list[int]:
    """--images: N or a list N,M,...; each between 0 and MAX_IMAGES."""
    try:
        counts = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise UserError(f"bad --images '{text}'", hint="images per request, e.g. 1 or 0,1,2,4") from None
    if not counts or any(not 0 <= c <= MAX_IMAGES for c in counts):
        raise UserError(f"bad --images '{text}': each count is between 0 and {MAX_IMAGES}")
    return counts


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """--image-size: WxH or a list WxH,WxH,...; each side between 1 and MAX_SIDE pixels."""
    sizes = []
    for part in str(text).split(","):
        w, x, h = part.strip().lower().partition("x")
        if not x or not w.isdigit() or not h.isdigit():
            raise UserError(f"bad --image-size '{text}'", hint="width x height in pixels, e.g. 224x224 or "
                                                                "224x224,1024x768")
        if not (1 <= int(w) <= MAX_SIDE and 1 <= int(h) <= MAX_SIDE):
            raise UserError(f"bad --image-size '{part.strip()}': each side is between 1 and {MAX_SIDE} pixels")
        sizes.append((int(w), int(h)))
    return sizes


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _stored(raw: bytes, final: bool) -> bytes:
    """`raw` as deflate stored blocks (at most 65,535 bytes each), the last one final when `final`."""
    out = []
    pieces = [raw[i:i + 65535] for i in range(0, len(raw), 65535)] or ([b""] if final else [])
    for n, piece in enumerate(pieces):
        last = final and n == len(pieces) - 1
        out.append(struct.pack("<BHH", 1 if last else 0, len(piece), len(piece) ^ 0xFFFF) + piece)
    return b"".join(out)


def _filtered(rows: bytes, stride: int) -> bytes:
    """PNG scanlines: each row after its filter byte (0: none)."""
    return b"".join(b"\0" + rows[y:y + stride] for y in range(0, len(rows), stride))


def png_bytes(width: int, height: int, rows: bytes) -> bytes:
    """An 8-bit RGB PNG of `rows` (height rows of width*3 bytes), its data stored uncompressed."""
    assert len(rows) == width * 3 * height
    raw = _filtered(rows, width * 3)
    return (_PNG_MAGIC + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + _chunk(b"IDAT", b"\x78\x01" + _stored(raw, True) + struct.pack(">I", zlib.adler32(raw)))
            + _chunk(b"IEND", b""))


def _adler32_combine(first: int, second: int, second_length: int) -> int:
    """The adler-32 of two byte strings joined, from each one's (zlib's adler32_combine, which Python lacks)."""
    base = 65521
    rem = second_length % base
    sum1 = first & 0xFFFF
    sum2 = (rem * sum1) % base
    sum1 = (sum1 + (second & 0xFFFF) + base - 1) % base
    sum2 = (sum2 + ((first >> 16) & 0xFFFF) + ((second >> 16) & 0xFFFF) + base - rem) % base
    return sum1 | (sum2 << 16)


class SyntheticImages:
    """Distinct noise images, each a pure function of (seed, name), that differ in every row and every column.

    The image's first row is its own noise; every row after it is stored with PNG's Up filter over one noise field
    per size, drawn once, so a decoded row is the sum of the first row and the field's rows above (mod 256): the
    difference of two images is their first rows' difference, repeated in every row. A processor that crops or
    resizes the image (SGLang hashes the processed pixels for its cache) still sees two different images.

    Only the first row is built per image: the PNG after it (the field's rows as stored deflate blocks, in an IDAT
    chunk of their own, padded to a multiple of 3 bytes by empty stored blocks) is made once per size, and its
    base64 too, so an image costs its first row, a checksum carried on from the field's, and one copy."""

    def __init__(self, seed: str):
        self.seed = seed
        self._fields: dict[tuple[int, int], tuple[bytes, str, int, int]] = {}

    def build(self, width: int, height: int) -> None:
        """Draw and encode the size's shared field now (prepare, before anything is timed), not in the send
        path: 1024x768 takes tens of milliseconds."""
        self._field(width, height)

    def _field(self, width: int, height: int) -> tuple[bytes, str, int, int]:
        """(the IDAT chunk of every row after the first, its base64, the adler-32 of those scanlines, their
        length)."""
        cached = self._fields.get((width, height))
        if cached is None:
            stride = width * 3
            noise = random.Random(f"{self.seed}:{width}x{height}").randbytes(stride * (height - 1))
            raw = b"".join(b"\2" + noise[y:y + stride] for y in range(0, len(noise), stride))
            body = _stored(raw, True) if raw else b""
            pad = next(k for k in range(3) if (12 + len(body) + 5 * k) % 3 == 0)
            body = b"".join(struct.pack("<BHH", 0, 0, 0xFFFF) for _ in range(pad)) + body
            idat = _chunk(b"IDAT", body) if raw else b""
            cached = self._fields[(width, height)] = (idat, base64.b64encode(idat).decode("ascii"),
                                                      zlib.adler32(raw), len(raw))
        return cached

    def _head(self, width: int, height: int, name: str) -> tuple[bytes, bytes]:
        """(the PNG up to the field: signature, header, padding, the zlib stream's start and the image's first
        row, a multiple of 3 bytes long; the PNG after the field: the stream's checksum and the end)."""
        _, _, field_adler, field_length = self._field(width, height)
        row = b"\0" + random.Random(f"{self.seed}:{name}").randbytes(width * 3)
        start = _PNG_MAGIC + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        first = _chunk(b"IDAT", b"\x78\x01" + _stored(row, height == 1))
        pad = next(k for k in range(3) if (len(start) + 20 + k + len(first)) % 3 == 0)  # tEXt: 12 + 8 + k
        head = start + _chunk(b"tEXt", b"Comment\0" + b"-" * pad) + first
        adler = _adler32_combine(zlib.adler32(row), field_adler, field_length)
        return head, _chunk(b"IDAT", struct.pack(">I", adler)) + _chunk(b"IEND", b"")

    def png(self, width: int, height: int, name: str) -> bytes:
        head, tail = self._head(width, height, name)
        return head + self._field(width, height)[0] + tail

    def data_url(self, width: int, height: int, name: str) -> str:
        """The image as a data URL; the same as data_url(png(...), "image/png"), built from the cached base64."""
        head, tail = self._head(width, height, name)
        return ("data:image/png;base64," + base64.b64encode(head).decode("ascii") + self._field(width, height)[1]
                + base64.b64encode(tail).decode("ascii"))


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG, GIF or JPEG file's header; None for another format or a damaged header."""
    if data[:8] == _PNG_MAGIC and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if data[:2] == b"\xff\xd8":  # JPEG: walk the markers to the first start-of-frame
        pos = 2
        while pos + 9 <= len(data):
            if data[pos] != 0xFF:
                return None
            marker = data[pos + 1]
            if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
                pos += 2
                continue
            length = struct.unpack(">H", data[pos + 2:pos + 4])[0]
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                h, w = struct.unpack(">HH", data[pos + 5:pos + 9])
                return w, h
            pos += 2 + length
    return None


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


class ImageFiles:
    """The synthetic images of `--image-url file` as files in the server's media directory: written by one thread
    (the sender's loop never waits on a disk), AHEAD requests ahead of the one being built, so a request's files are
    usually there before it is sent; all of them removed when the bench ends (`close`), so a long run's directory
    does not grow without bound. Each bench's files start with a prefix of its own (`prefix`)."""

    AHEAD = 8  # requests whose files are written before they are built

    def __init__(self, directory: Path, prefix: str):
        self.directory, self.prefix = directory, prefix
        self._writer: ThreadPoolExecutor | None = None
        self._written: dict[str, Future[None] | None] = {}  # None: on disk already (no future kept per image)

    def ahead(self, name: str, build: Any) -> None:
        """Have the file `name` (bytes from `build()`) written, if it is not already."""
        if name in self._written:
            return
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="servelab-image-files")
        self._written[name] = self._writer.submit(lambda: (self.directory / name).write_bytes(build()) and None)

    def wait(self, name: str) -> None:
        """Until `name` is on disk; an error writing it raises here, as a one-line UserError."""
        written = self._written[name]
        if written is None:
            return
        try:
            written.result()
        except OSError as exc:
            raise UserError(f"--image-dir {self.directory}: cannot write {name}: {exc.strerror}") from None
        self._written[name] = None

    def close(self) -> None:
        """Stop the writer and remove every file this bench wrote."""
        if self._writer is not None:
            self._writer.shutdown(wait=True, cancel_futures=True)
            self._writer = None
        for name in self._written:
            (self.directory / name).unlink(missing_ok=True)
        self._written.clear()


@dataclass
class DatasetImage:
    url: str
    pixels: int | None  # None: a format whose header servelab does not read
    size: str | None = None  # "WxH", when the header was read


@dataclass
class ImageWorkload:
    """The requests of `inner` (any workload of chat requests) with images in their last user message."""

    inner: Any
    counts: list[int] = field(default_factory=lambda: [1])
    sizes: list[tuple[int, int]] = field(default_factory=lambda: [(224, 224)])
    seed: int = 0
    transport: str = "data"  # "data": base64 data URLs; "file": file:// URLs into image_dir
    image_dir: Path | None = None
    from_dataset: bool = False  # the images are the dataset lines' own (`images` in a JSONL line)
    series: str = ""  # which bench of a run (pipeline.in_series): passed to the inner workload, and to the pixels
    _dataset_images: dict[str, DatasetImage] = field(default_factory=dict, init=False, repr=False)

    kind = "images"

    def __post_init__(self) -> None:
        if not self.inner.endpoint.endswith("/chat/completions"):
            raise UserError("images are sent in chat messages", hint="use --endpoint chat")
        if self.transport not in TRANSPORTS:
            raise UserError(f"unknown --image-url '{self.transport}'", hint="use --image-url data or file")
        if self.transport == "file":
            if self.from_dataset:
                raise UserError("--image-url file applies to synthetic images (--images); a dataset's images are "
                                "sent as data URLs")
            if self.image_dir is None:
                raise UserError("--image-url file needs --image-dir DIR, the directory the server reads file:// "
                                "URLs from (llama.cpp: --media-path DIR)")
            if not self.image_dir.is_dir():
                raise UserError(f"--image-dir {self.image_dir}: no such directory")
        if self.series and any(f.name == "series" for f in dataclasses.fields(self.inner)):
            self.inner = dataclasses.replace(self.inner, series=self.series)
        self.images = SyntheticImages(f"{self.seed}:{self.series}")
        self.files = ImageFiles(self.image_dir, f"servelab-{secrets.token_hex(4)}-") \
            if self.transport == "file" and self.image_dir is not None else None

    @property
    def endpoint(self) -> str:
        return self.inner.endpoint

    async def prepare(self, counter: PromptTokenCounter | None, needed: int | None = None) -> None:
        await self.inner.prepare(counter, needed)
        if self.from_dataset:
            self._load_dataset_images()
        elif any(self.counts):
            for width, height in self.sizes:
                self.images.build(width, height)

    def _load_dataset_images(self) -> None:
        total = 0
        for item in self.inner.items:
            for path in item.images or ():
                if path in self._dataset_images:
                    continue
                try:
                    data = Path(path).read_bytes()
                except OSError as exc:
                    raise UserError(f"{item.where}: cannot read image {path}: {exc.strerror}") from None
                total += len(data)
                if total > MAX_DATASET_IMAGE_BYTES:
                    raise UserError(f"{item.where}: the dataset's images are more than "
                                    f"{MAX_DATASET_IMAGE_BYTES >> 30} GiB together: more than servelab holds")
                size = image_size(data)
                mime = _MIME.get(Path(path).suffix.lower(), "application/octet-stream")
                self._dataset_images[path] = DatasetImage(data_url(data, mime), size[0] * size[1] if size else None,
                                                          f"{size[0]}x{size[1]}" if size else None)

    def shape(self, index: int) -> tuple[int, tuple[int, int]]:
        """(images, (width, height)) of synthetic request `index`: every count with the first size, then with the
        next size, and so on."""
        return self.counts[index % len(self.counts)], self.sizes[(index // len(self.counts)) % len(self.sizes)]

    def request(self, index: int, model: str, *, tag: str = "", warmup: bool = False,
                accepts_ignore_eos: bool = False, accepts_min_tokens: bool = False) -> RequestSpec:
        spec = self.inner.request(index, model, tag=tag, warmup=warmup, accepts_ignore_eos=accepts_ignore_eos,
                                  accepts_min_tokens=accepts_min_tokens)
        if self.from_dataset:
            urls, pixels, sizes = self._dataset_parts(index)
        else:
            count, (w, h) = self.shape(index)
            urls = [self._synthetic_url(index, warmup, k) for k in range(count)]
            pixels, sizes = w * h * count, ",".join([f"{w}x{h}"] * count)
        if not urls:
            spec.images, spec.image_pixels, spec.image_sizes = 0, 0, ""
            return spec
        messages = spec.body["messages"]
        last = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        content = messages[last]["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
        spec.body["messages"] = [*messages[:last], {**messages[last], "content": parts}, *messages[last + 1:]]
        spec.images, spec.image_pixels, spec.image_sizes = len(urls), pixels, sizes
        if not self.from_dataset:  # a dataset's data URLs are one string per file, shared by every request
            spec.own_bytes = sum(len(url) for url in urls)
        spec.input_tokens = None  # counted for the text alone: the server's count includes the images' tokens
        return spec

    def _synthetic_url(self, index: int, warmup: bool, k: int) -> str:
        """Image k of request `index`: a data URL, or a file URL whose file (and the next requests') the writer
        thread has on disk by the time it returns."""
        if self.files is None:
            _, (width, height) = self.shape(index)
            return self.images.data_url(width, height, self._name(index, warmup, k))
        for ahead in range(index, index + ImageFiles.AHEAD + 1):
            count, _ = self.shape(ahead)
            for j in range(count):
                self._file_ahead(ahead, warmup, j)
        file_name = self._file_name(index, warmup, k)
        self.files.wait(file_name)
        return f"file://{file_name}"

    @staticmethod
    def _name(index: int, warmup: bool, k: int) -> str:
        return f"{'w' if warmup else ''}{index}-{k}"

    def _file_name(self, index: int, warmup: bool, k: int) -> str:
        _, (width, height) = self.shape(index)
        assert self.files is not None
        return f"{self.files.prefix}{self._name(index, warmup, k)}-{width}x{height}.png"

    def _file_ahead(self, index: int, warmup: bool, k: int) -> None:
        _, (width, height) = self.shape(index)
        name = self._name(index, warmup, k)
        assert self.files is not None
        self.files.ahead(self._file_name(index, warmup, k), lambda: self.images.png(width, height, name))

    def close(self) -> None:
        """The bench is over: remove the image files it wrote (--image-url file)."""
        if self.files is not None:
            self.files.close()

    def _dataset_parts(self, index: int) -> tuple[list[str], int | None, str]:
        item = self.inner.item(index)
        images = [self._dataset_images[p] for p in item.images or ()]
        pixels = None if any(i.pixels is None for i in images) else sum(i.pixels for i in images)  # type: ignore
        return [i.url for i in images], pixels, ",".join(i.size or "?" for i in images)

    def describe(self, accepts_ignore_eos: bool, accepts_min_tokens: bool = False) -> dict[str, Any]:
        d = {"kind": self.kind, "text": self.inner.describe(accepts_ignore_eos, accepts_min_tokens),
             "endpoint": self.endpoint, "url": self.transport}
        if self.from_dataset:
            d["images"] = "from the dataset's lines"
            d["image_files"] = len(self._dataset_images)
        else:
            d.update(images_per_request=self.counts, image_sizes=[f"{w}x{h}" for w, h in self.sizes],
                     pixels="seeded noise, distinct per image, PNG stored uncompressed", seed=self.seed)
        return d


def with_images(text: Any, a: Any) -> Any:
    """The bench's workload (`a`: its BenchArgs) with images when --images asks for them or the dataset's lines
    name them; `text` itself otherwise. Image options without images are refused, not ignored."""
    in_dataset = any(getattr(it, "images", None) for it in getattr(text, "items", None) or ())
    if a.images is None and not in_dataset:
        for name, given in (("image-size", a.image_size != "224x224"), ("image-url", a.image_url != "data"),
                            ("image-dir", a.image_dir is not None)):
            if given:
                raise UserError(f"--{name} applies to chat with images: add --images N")
        return text
    if a.mode in ("multiturn", "replay"):
        raise UserError(f"images apply to single-turn chat workloads, not --mode {a.mode}")
    if in_dataset and a.images is not None:
        raise UserError("the dataset's lines name their own images: --images adds synthetic ones to a text "
                        "workload", hint="leave out --images, or use a dataset without `images`")
    if in_dataset:
        return ImageWorkload(inner=text, seed=a.seed, transport=a.image_url, from_dataset=True)
    return ImageWorkload(inner=text, counts=parse_counts(a.images), sizes=parse_sizes(a.image_size), seed=a.seed,
                         transport=a.image_url, image_dir=Path(a.image_dir) if a.image_dir is not None else None)
