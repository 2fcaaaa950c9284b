"""Small PDFs written byte by byte for tests: text pages, a scan, an encrypted
file, a truncated one. Each is a valid PDF 1.4 file (cross-reference table
with exact offsets) unless it is meant not to be.

``python -m tests.pdf_samples DIR`` writes the bad-file fixture folder that
``attest ingest`` must report file by file (docs/ingest-files.md).
"""

from __future__ import annotations

import sys
from pathlib import Path


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def _page_stream(lines: list[str]) -> bytes:
    """Helvetica 10 pt (Windows-1252), one text line every 14 pt from the top of a Letter page."""
    out = ["BT", "/F1 10 Tf", "14 TL", "50 740 Td"]
    for line in lines:
        out.append(f"({_escape(line)}) Tj T*")
    out.append("ET")
    return "\n".join(out).encode("cp1252")


def _assemble(objects: list[bytes], trailer_extra: str = "") -> bytes:
    """Objects 1..n (object 1 the catalog), a cross-reference table and a trailer."""
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for offset in offsets:
        out += f"{offset:010d} 00000 n \n".encode()
    out += (
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R {trailer_extra}>>\n"
        f"startxref\n{xref}\n%%EOF\n"
    ).encode()
    return bytes(out)


def _stream(data: bytes, extra: str = "") -> bytes:
    return f"<< /Length {len(data)} {extra}>>\nstream\n".encode() + data + b"\nendstream"


def text_pdf(pages: list[list[str]], *, title: str = "", encrypted: bool = False) -> bytes:
    """A PDF whose pages hold these lines of text."""
    n = len(pages)
    # 1 catalog, 2 pages, 3 font, then per page: page object, content stream.
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(n))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ]
    for i, lines in enumerate(pages):
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>".encode()
        )
        objects.append(_stream(_page_stream(lines)))
    extra = ""
    if title:
        objects.append(f"<< /Title ({_escape(title)}) >>".encode())
        extra += f"/Info {len(objects)} 0 R "
    if encrypted:
        # The standard security handler, revision 2, with a user password: the
        # /U entry matches no empty password, so a reader must ask for one.
        objects.append(
            b"<< /Filter /Standard /V 1 /R 2 /P -44 "
            b"/O <" + b"6a" * 32 + b"> /U <" + b"3c" * 32 + b"> >>"
        )
        extra += f"/Encrypt {len(objects)} 0 R /ID [<{'ab' * 16}> <{'ab' * 16}>] "
    return _assemble(objects, extra)


def scanned_pdf(pages: int = 2) -> bytes:
    """Pages that hold an image each and no text: what a scanner writes."""
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(pages))
    pixels = bytes(range(0, 256, 4)) * 4  # 16 x 16 grey
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode(),
        _stream(
            pixels,
            "/Type /XObject /Subtype /Image /Width 16 /Height 16 "
            "/ColorSpace /DeviceGray /BitsPerComponent 8 ",
        ),
    ]
    for i in range(pages):
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /XObject << /Im1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>".encode()
        )
        objects.append(_stream(b"q 500 0 0 700 56 46 cm /Im1 Do Q"))
    return _assemble(objects)


STATEMENT = [
    "ACME WIDGETS, INC.",
    "CONSOLIDATED STATEMENTS OF CASH FLOWS",
    "(in millions)",
    "Year Ended December 31,",
    "2018 2017 2016",
    "Investing activities:",
    "Purchases of property, plant and equipment $ (1,577) $ (1,373) $ (1,420)",
    "Proceeds from sale of businesses 25 — 1,214",
    "Net cash used in investing activities (1,552) (1,373) (206)",
]

PROSE = [
    "Acme Widgets makes widgets for the aerospace market. The company was founded",
    "in 1951 and employs 2,400 people in four countries.",
    "Outlook",
    "Management expects revenue to grow in 2019.",
]


def bad_files(folder: Path) -> dict[str, str]:
    """Write the four files ``attest ingest`` must refuse one by one, beside a
    good one; returns each bad file's name and a word its reason must contain."""
    folder.mkdir(parents=True, exist_ok=True)
    good = text_pdf([PROSE, STATEMENT], title="Acme Widgets Annual Report 2018")
    (folder / "good.pdf").write_bytes(good)
    (folder / "encrypted.pdf").write_bytes(text_pdf([PROSE], encrypted=True))
    (folder / "scanned.pdf").write_bytes(scanned_pdf())
    (folder / "truncated.pdf").write_bytes(good[: len(good) // 2])
    (folder / "page.pdf").write_bytes(
        b"<!DOCTYPE html>\n<html><head><title>Not found</title></head>"
        b"<body><p>The report you asked for has moved.</p></body></html>\n"
    )
    return {
        "encrypted.pdf": "encrypted",
        "scanned.pdf": "no text layer",
        "truncated.pdf": "truncated",
        "page.pdf": "HTML",
    }


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "bad-pdfs")
    for name, why in bad_files(target).items():
        print(f"{target / name}: must fail ({why})")
