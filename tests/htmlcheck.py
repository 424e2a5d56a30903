"""A well-formedness check of the HTML pages the emulator writes (html.parser based), and the
values they mark: every element is closed in order, void elements excepted; every <img> is a PNG
data URI; nothing is loaded from elsewhere."""
from __future__ import annotations

import base64
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
PNG = b"\x89PNG\r\n\x1a\n"


class Checker(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.images: list[tuple[bytes, str]] = []  # (PNG bytes, alt)
        self.values: list[dict[str, str]] = []  # attributes of the elements with data-key
        self.doctype = False
        self.text: list[str] = []

    def handle_decl(self, decl: str) -> None:
        self.doctype = self.doctype or decl.lower() == "doctype html"

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "img":
            src = a.get("src", "")
            if not src.startswith("data:image/png;base64,"):
                self.errors.append(f"an image not embedded as a PNG: {src[:60]!r}")
            else:
                self.images.append((base64.b64decode(src.split(",", 1)[1], validate=True), a.get("alt", "")))
        for k in ("href", "src"):
            if k in a and not a[k].startswith(("data:", "#")):
                self.errors.append(f"<{tag} {k}={a[k]!r}> loads from elsewhere")
        if "data-key" in a:
            self.values.append(a)
        if tag in ("script", "iframe", "object"):
            self.errors.append(f"<{tag}> in the page")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            self.errors.append(f"</{tag}> closes a void element")
        elif not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else 'nothing'}>")
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def check_html(text: str) -> Checker:
    """Parse ``text``; assert it is a well-formed, self-contained HTML5 page; return the checker."""
    c = Checker()
    c.feed(text)
    c.close()
    assert c.doctype, "no <!DOCTYPE html>"
    assert not c.errors, c.errors
    assert not c.stack, f"unclosed: {c.stack}"
    for png, alt in c.images:
        assert png.startswith(PNG), alt
        assert alt, "an image without alt text"
    return c
