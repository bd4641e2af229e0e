"""What images and documents cost (ctxkernel.media): the providers' documented rules on real files
made by Pillow and pypdf, and the fallback without those libraries or for files they cannot read:
never less than the rules give."""

from __future__ import annotations

import base64
import io
import sys

import pytest

from ctxkernel import media
from ctxkernel.convert import anthropic_block, openai_part

pytest.importorskip("PIL", reason="Pillow comes with the serve extra (make install)")
pytest.importorskip("pypdf", reason="pypdf comes with the serve extra (make install)")


def image(width: int, height: int, fmt: str) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 120, 200)).save(out, format=fmt)
    return out.getvalue()


def pdf(pages: int) -> bytes:
    from pypdf import PdfWriter

    writer = PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(612, 792)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def raw_pdf(objects: list[str]) -> bytes:
    """A PDF written object by object (object 1 is the catalog), with a correct xref table."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj {body} endobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += f"trailer << /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def page_tree(pages: int, count: int) -> bytes:
    """A PDF of ``pages`` pages whose page tree says it has ``count``."""
    kids = " ".join(f"{n} 0 R" for n in range(3, 3 + pages))
    catalog = "<< /Type /Catalog /Pages 2 0 R >>"
    return raw_pdf(
        [catalog, f"<< /Type /Pages /Kids [{kids}] /Count {count} >>"] + ["<< /Type /Page /Parent 2 0 R >>"] * pages
    )


def without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``import`` of each module fail, as on an install without the serve extra."""
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP"])
def test_image_size_is_read_from_each_format_the_providers_accept(fmt):
    assert media.image_size(image(640, 480, fmt)) == (640, 480)


@pytest.mark.parametrize(
    ("size", "tokens"),
    [
        # Anthropic's examples: width x height / 750 after the resize, about 1,600 at most
        ((200, 200), 54),
        ((1000, 1000), 1334),
        ((1092, 1092), 1590),
        ((4000, 3000), media.ANTHROPIC_IMAGE_MAX),
        ((3000, 100), 110),  # the long edge scaled to 1568 first: 1568 x 52.3 / 750
    ],
)
def test_anthropic_image_rule(size, tokens):
    assert media.anthropic_image_tokens(size) == tokens


@pytest.mark.parametrize(
    ("size", "detail", "tokens"),
    [
        # OpenAI's examples: 85 + 170 per 512 px tile after fitting 2048 and a 768 px short side
        ((1024, 1024), "high", 765),
        ((2048, 4096), "high", 1105),
        ((4096, 8192), None, 1105),
        ((300, 300), None, 255),
        ((4096, 8192), "low", 85),
    ],
)
def test_openai_image_rule(size, detail, tokens):
    assert media.openai_image_tokens(size, detail) == tokens


def test_pdf_pages_are_counted_with_pypdf():
    three = pdf(3)
    assert media.pdf_pages(three) == 3
    # a small PDF still costs every page: its size in bytes says nothing of its pages' images
    assert len(three) < 3 * media.PDF_PAGE_TOKENS
    assert media.media_tokens("anthropic", "document", three, "application/pdf") == 3 * media.PDF_PAGE_TOKENS
    assert media.media_tokens("openai", "file", three, None) == 3 * media.PDF_PAGE_TOKENS  # found by %PDF


def test_without_pillow_an_image_costs_the_most_any_image_can(monkeypatch):
    data = image(200, 200, "PNG")
    without(monkeypatch, "PIL", "PIL.Image")
    assert media.image_size(data) is None
    assert media.media_tokens("anthropic", "image", data, "image/png") == media.ANTHROPIC_IMAGE_MAX
    assert media.media_tokens("openai", "image", data, "image/png") == media.OPENAI_IMAGE_MAX
    # the most: no image a provider accepts costs more
    assert media.OPENAI_IMAGE_MAX >= max(
        media.openai_image_tokens((w, h), None) for w in (1, 768, 4096) for h in (1, 2048, 9000)
    )
    assert media.ANTHROPIC_IMAGE_MAX >= max(
        media.anthropic_image_tokens((w, h)) for w in (1, 1568, 8000) for h in (1, 1568, 8000)
    )
    # and the block a client sent carries that cost into the log
    block = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()},
    }
    assert anthropic_block(block, "messages.0").tokens == media.ANTHROPIC_IMAGE_MAX


def test_without_pypdf_a_pdf_costs_one_token_per_byte(monkeypatch):
    data = pdf(2)
    without(monkeypatch, "pypdf")
    assert media.pdf_pages(data) is None
    assert media.media_tokens("anthropic", "document", data, "application/pdf") == len(data)
    url = "data:application/pdf;base64," + base64.b64encode(data).decode()
    part = {"type": "file", "file": {"filename": "a.pdf", "file_data": url}}
    assert openai_part(part, "messages.0").tokens == len(data)


@pytest.mark.parametrize(
    "data",
    [
        b"\x89PNG\r\n\x1a\n" + b"\x00" * 40,  # a PNG signature and nothing readable after it
        b"GIF89a\xff\xff\xff\xff",  # 65535 x 65535 claimed, no image
        b"not an image at all",
        b"",
    ],
    ids=["torn-png", "claims-huge", "text", "empty"],
)
def test_an_image_pillow_cannot_read_costs_the_most(data):
    assert media.media_tokens("anthropic", "image", data, "image/png") == media.ANTHROPIC_IMAGE_MAX
    assert media.media_tokens("responses", "image", data, "image/png") == media.OPENAI_IMAGE_MAX


def test_a_pdf_pypdf_cannot_read_costs_its_bytes():
    torn = pdf(4)[:200]
    assert media.pdf_pages(torn) is None
    assert media.media_tokens("anthropic", "document", torn, "application/pdf") == len(torn)
    assert media.media_tokens("anthropic", "document", b"%PDF-1.7 garbage", None) == len(b"%PDF-1.7 garbage")


def test_a_medium_without_bytes_costs_the_most():
    assert media.media_tokens("anthropic", "image", None, None) == media.ANTHROPIC_IMAGE_MAX
    assert media.media_tokens("openai", "file", None, None) == 100 * media.PDF_PAGE_TOKENS


def test_a_pdf_is_counted_by_its_pages_not_by_what_it_claims():
    assert media.pdf_pages(page_tree(50, count=1)) == 50
    # a page tree whose kids array is an object of its own
    indirect = raw_pdf(
        [
            "<< /Type /Catalog /Pages 2 0 R >>",
            "<< /Type /Pages /Kids 3 0 R /Count 2 >>",
            "[4 0 R 5 0 R]",
            "<< /Type /Page /Parent 2 0 R >>",
            "<< /Type /Page /Parent 2 0 R >>",
        ]
    )
    assert media.pdf_pages(indirect) == 2


def test_a_hostile_page_tree_costs_bounded_work(monkeypatch):
    # a tree that contains itself, and one wider than any provider takes: read up to the bound,
    # then counted by their bytes
    looping = raw_pdf(["<< /Type /Catalog /Pages 2 0 R >>", "<< /Type /Pages /Kids [2 0 R] /Count 1 >>"])
    assert media.pdf_pages(looping) is None
    monkeypatch.setattr(media, "PDF_MAX_PAGES", 20)
    monkeypatch.setattr(media, "PDF_MAX_NODES", 40, raising=False)
    assert media.pdf_pages(page_tree(20, count=20)) == 20
    too_many = page_tree(21, count=1)
    assert media.pdf_pages(too_many) is None
    assert media.media_tokens("anthropic", "document", too_many, "application/pdf") == len(too_many)
    read: list[int] = []
    from pypdf.generic import IndirectObject

    real = IndirectObject.get_object
    monkeypatch.setattr(IndirectObject, "get_object", lambda self: read.append(1) or real(self))
    assert media.pdf_pages(page_tree(500, count=1)) is None
    assert len(read) <= 40 + 5  # the tree's nodes, and the few objects above it
