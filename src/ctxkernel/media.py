"""Images, documents and files a client sends: what they cost, counted with the provider's rules.

A medium is kept as a :class:`~ctxkernel.messages.MediaBlock`: its bytes go to the store's blob
table under a content-addressed key (:func:`blob_key`), and its cost is counted once, when it
comes in, by the rules the provider documents:

- **Anthropic images**: an image whose long edge is over 1568 px is scaled down to it, and one
  still over about 1.15 megapixels (1,600 tokens) is scaled down further; it then costs
  ``width × height / 750`` tokens, rounded up (at most :data:`ANTHROPIC_IMAGE_MAX`).
- **OpenAI images** (Chat Completions and Responses): ``detail: "low"`` costs 85 tokens; any other
  detail is scaled to fit 2048 × 2048, then its shortest side to 768 px (never up), and costs 85
  plus 170 per 512 px tile.
- **PDF documents** (both providers read every page as text and as an image): 3,000 tokens per
  page, the top of the range Anthropic documents (a page of text measures about 2,300); the pages
  are counted with ``pypdf``.
- **Text documents and anything else**: one token per byte of its content, which no byte-level
  tokenizer exceeds.

Pillow and pypdf come with the ``serve`` extra (and the ``media`` one). Without them, or for a
file they cannot read (damaged, hostile, an image given by URL), an image costs the most any image
of that provider can and a PDF one token per byte: never less than the rules above, so the
effective window holds with media too (a large PDF may then not fit at all).
"""

from __future__ import annotations

import hashlib
import io
import math
from typing import Any

#: an Anthropic image's long edge is scaled down to this many pixels
ANTHROPIC_LONG_EDGE = 1568
#: and its cost to at most this many tokens (about 1.15 megapixels)
ANTHROPIC_IMAGE_MAX = 1600
ANTHROPIC_PIXELS_PER_TOKEN = 750
#: OpenAI's image tiling
OPENAI_LOW_DETAIL = 85
OPENAI_TILE_TOKENS = 170
OPENAI_FIT = 2048
OPENAI_SHORT_SIDE = 768
OPENAI_TILE = 512
#: the most an OpenAI image can cost (768 × 2048: 2 × 4 tiles)
OPENAI_IMAGE_MAX = OPENAI_LOW_DETAIL + OPENAI_TILE_TOKENS * 8
#: tokens a PDF page costs at most (its text and its page image)
PDF_PAGE_TOKENS = 3000
#: a PDF with more pages than this is counted by its bytes (the providers take a few hundred at most)
PDF_MAX_PAGES = 1000
#: the page-tree nodes read to count a PDF's pages, at most (its pages and the nodes above them)
PDF_MAX_NODES = 2 * PDF_MAX_PAGES
#: the blob table's folder for media
BLOB_PREFIX = "media"


def blob_key(data: bytes) -> str:
    """The store key of a medium's bytes: ``media/<sha256>`` (the same bytes, one blob)."""
    return f"{BLOB_PREFIX}/{hashlib.sha256(data).hexdigest()}"


def image_size(data: bytes) -> tuple[int, int] | None:
    """An image's width and height from its header (Pillow reads no pixel for it), or None."""
    try:
        from PIL import Image
    except ImportError:
        return None
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except Exception:  # any file Pillow cannot read costs the most an image can
        return None
    if width <= 0 or height <= 0:
        return None
    return width, height


def anthropic_image_tokens(size: tuple[int, int] | None) -> int:
    if size is None:
        return ANTHROPIC_IMAGE_MAX
    scale = min(1.0, ANTHROPIC_LONG_EDGE / max(size))
    pixels = size[0] * scale * size[1] * scale
    # still over the token cap: scaled down further, keeping the aspect ratio
    pixels = min(pixels, ANTHROPIC_IMAGE_MAX * ANTHROPIC_PIXELS_PER_TOKEN)
    return min(ANTHROPIC_IMAGE_MAX, max(1, math.ceil(pixels / ANTHROPIC_PIXELS_PER_TOKEN)))


def openai_image_tokens(size: tuple[int, int] | None, detail: str | None) -> int:
    if detail == "low":
        return OPENAI_LOW_DETAIL
    if size is None:
        return OPENAI_IMAGE_MAX
    width, height = float(size[0]), float(size[1])
    fit = min(1.0, OPENAI_FIT / max(width, height))
    width, height = width * fit, height * fit
    short = min(width, height)
    if short > OPENAI_SHORT_SIDE:
        width, height = width * OPENAI_SHORT_SIDE / short, height * OPENAI_SHORT_SIDE / short
    tiles = math.ceil(width / OPENAI_TILE) * math.ceil(height / OPENAI_TILE)
    return OPENAI_LOW_DETAIL + OPENAI_TILE_TOKENS * tiles


def pdf_pages(data: bytes) -> int | None:
    """How many pages a PDF has, or None when it cannot be read or has more than
    :data:`PDF_MAX_PAGES`. pypdf parses the file; the page tree is walked here rather than
    through ``len(reader.pages)``, which resolves every page of any size of tree, so that a
    hostile file costs at most :data:`PDF_MAX_NODES` object reads (the walk runs where the
    request is parsed)."""
    try:
        from pypdf import PdfReader
        from pypdf.generic import ArrayObject, DictionaryObject, IndirectObject
    except ImportError:
        return None
    try:
        root = PdfReader(io.BytesIO(data)).trailer["/Root"]
        if not isinstance(root, DictionaryObject):
            return None
        stack: list[Any] = [root.raw_get("/Pages")]
        seen: set[tuple[int, int]] = set()
        pages = nodes = 0
        while stack:
            ref = stack.pop()
            if isinstance(ref, IndirectObject):
                if (ref.idnum, ref.generation) in seen:
                    return None  # a tree that loops
                seen.add((ref.idnum, ref.generation))
            nodes += 1
            if nodes > PDF_MAX_NODES:
                return None
            node = ref.get_object()
            if not isinstance(node, DictionaryObject):
                return None
            kids = node.get("/Kids")
            if isinstance(kids, IndirectObject):  # the array itself may be a reference
                nodes += 1
                kids = kids.get_object()
            if kids is None:
                pages += 1
            elif isinstance(kids, ArrayObject):
                stack.extend(kids)
            else:
                return None
    except Exception:  # a damaged or hostile PDF is counted by its bytes
        return None
    return pages if 0 < pages <= PDF_MAX_PAGES else None


def media_tokens(api: str, kind: str, data: bytes | None, media_type: str | None, detail: str | None = None) -> int:
    """What one medium costs with ``api``'s provider (see the module's rules)."""
    if kind == "image":
        size = image_size(data) if data else None
        return anthropic_image_tokens(size) if api == "anthropic" else openai_image_tokens(size, detail)
    if data is None:
        # a document by URL or by file id: the provider reads it, we cannot; the largest
        # document a provider accepts is far above any window, so count what a 100-page PDF costs
        return 100 * PDF_PAGE_TOKENS
    if media_type == "application/pdf" or data.startswith(b"%PDF"):
        pages = pdf_pages(data)
        if pages is not None:
            return pages * PDF_PAGE_TOKENS
    return len(data)


def split_data_url(url: str) -> tuple[str | None, bytes] | None:
    """``(media type, bytes)`` of a ``data:<type>;base64,<data>`` URL, or None for any other URL
    (an http URL, or base64 that does not decode)."""
    import base64
    import binascii

    if not url.startswith("data:"):
        return None
    head, comma, payload = url[5:].partition(",")
    if not comma or not head.endswith(";base64"):
        return None
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return None
    media_type = head[: -len(";base64")] or None
    return media_type, data


def b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode("ascii")


def data_url(media_type: str | None, data: bytes) -> str:
    return f"data:{media_type or 'application/octet-stream'};base64,{b64(data)}"


def decode_b64(value: Any) -> bytes | None:
    """The bytes of a base64 string, or None when it is not one."""
    import base64
    import binascii

    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
