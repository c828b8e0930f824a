"""Pure wikitext cleaning: an article's markup to plain prose paragraphs, with mwparserfromhell.

A pure function of its argument (no I/O, no Beam): the Wikipedia reader's ``clean`` (``preprocess.readers.wikipedia``),
which ``preprocess.text.to_document`` applies. Paragraphs are separated by a single "\\n".
"""
from __future__ import annotations

import html
import re
from collections import Counter

import mwparserfromhell
from mwparserfromhell.nodes import (
    Comment,
    ExternalLink,
    Heading,
    HTMLEntity,
    Tag,
    Template,
    Text,
    Wikilink,
)

# Sections after which an article holds no prose (citations, link lists). The article is cut at
# the first such heading, which also spares the parser the heaviest markup of the page.
STOP_SECTIONS = frozenset({
    "references", "external links", "see also", "further reading", "notes", "bibliography",
    "sources", "footnotes", "citations", "notes and references", "references and notes",
    "works cited", "sources and further reading", "notes and sources",
})

# Link namespaces whose links render as no text (images, categories), with common localized
# names so non-English dumps are cleaned the same way.
_HIDDEN_LINK_NAMESPACES = frozenset({
    "file", "image", "media", "category",
    "datei", "bild", "kategorie",                      # de
    "fichier", "catégorie", "categorie",               # fr, nl
    "archivo", "imagen", "categoría", "categoria",     # es, it, pt
    "immagine", "arquivo", "imagem", "bestand", "afbeelding", "plik", "grafika", "kategoria",
    "файл", "изображение", "категория", "文件", "分类", "ファイル", "カテゴリ",
})

# Tags whose contents are not running prose (or not text at all). Formatting tags (b, i, sub,
# sup, span, div, blockquote, poem, ...) are not listed and keep their inner text.
_DROPPED_TAGS = frozenset({
    "ref", "references", "gallery", "math", "code", "table", "timeline", "score", "chem", "ce",
    "hiero", "graph", "imagemap", "inputbox", "categorytree", "templatedata", "templatestyles",
    "section", "syntaxhighlight", "source", "pre", "mapframe", "maplink", "math chem",
})

# Pre-parse regexes. Removing comments and <ref>s before parsing halves the parse time (refs
# carry most of the citation templates). The ref body may not contain another <ref or </ref, so
# an unclosed <ref> cannot swallow the text up to some later ref's close tag; such a stray tag
# is left to the parser, whose Tag node is dropped as well.
# Each scan stops where the construct cannot go on, so every pattern stays linear: an unclosed comment hides the
# rest of the page (as MediaWiki renders it), and a tag's attributes end at the next "<" (else each of thousands of
# "<!--" or "<ref name=" would rescan the rest of the page: minutes for a few hundred kilobytes).
_COMMENT_RE = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
_REF_RE = re.compile(
    r"<ref\b[^<>]*/>|<ref(?:\s[^<>]*)?(?<!/)>[^<]*(?:<(?!/?ref\b)[^<]*)*</ref\s*>", re.I
)
_HEADING_RE = re.compile(r"^(=+)[ \t]*(.*?)[ \t]*\1[ \t]*$", re.M)

# Post-render fixups.
_MAGIC_WORD_RE = re.compile(r"__[A-Z]+__")
_QUOTES_RE = re.compile(r"'{2,}")
_EMPTY_PARENS_RE = re.compile(r"\(\s*[,;:]?\s*\)")
_SPACE_BEFORE_PUNCT_RE = re.compile(r"\s+([,.;:!?)])")
_SPACE_AFTER_OPEN_RE = re.compile(r"\(\s+")
_OPEN_PAREN_JUNK_RE = re.compile(r"\(\s*[,;]\s*")
# Lines that are leftovers of markup the parser could not pair (a broken table or template).
_JUNK_LINE_RE = re.compile(r"^(?:\{\||\|\}|\||!|\{\{|\}\})")
_TRAILING_PARENS_RE = re.compile(r"\s*\([^)]*\)\s*$")
_INTERLANGUAGE_RE = re.compile(r"^[a-z]{2,3}(?:-[a-z0-9]+){0,2}$|^simple$")


def _norm_heading(title: str) -> str:
    return " ".join(_QUOTES_RE.sub("", title).split()).strip(" :").lower()


def _render(code, out: list[str]) -> None:
    """Append the visible prose of a parsed Wikicode to ``out``."""
    for node in code.nodes:
        if isinstance(node, Text):
            out.append(node.value)
        elif isinstance(node, Wikilink):
            _render_wikilink(node, out)
        elif isinstance(node, Tag):
            tag = str(node.tag).strip().lower()
            if tag in _DROPPED_TAGS:
                continue
            if tag in ("br", "hr"):
                out.append("\n")
            elif node.contents is not None and not node.self_closing:
                _render(node.contents, out)
        elif isinstance(node, ExternalLink):
            # A bare URL is not prose; a bracketed link shows only its title.
            if node.brackets and node.title is not None:
                _render(node.title, out)
        elif isinstance(node, HTMLEntity):
            try:
                out.append(node.normalize())
            except ValueError:
                out.append(" ")
        elif isinstance(node, Heading):
            # Headings are dropped; the line break keeps the text around them apart.
            out.append("\n")
        elif isinstance(node, Template):
            _render_template(node, out)
        elif isinstance(node, Comment):
            continue
        # Arguments ({{{1}}}) and anything unknown render as nothing.


# Inline templates whose output is part of the sentence: keep that text, or a gap is left ("At , …").
_KEEP_FIRST_ARGUMENT = {"small", "smaller", "big", "larger", "nowrap", "nobr", "sic", "abbr", "flag", "flagcountry",
                        "flagdeco", "em", "strong", "var", "mvar", "math", "tooltip", "keypress", "not a typo", "ill"}
_RANGE_WORDS = {"to", "-", "–", "and", "or", "by", "x", "×", "+/-", "±"}


def _template_arguments(node: Template) -> list[str]:
    values = []
    for param in node.params:
        if not param.showkey:
            parts: list[str] = []
            _render(param.value, parts)
            values.append(" ".join("".join(parts).split()))
    return values


def _render_template(node: Template, out: list[str]) -> None:
    """Render the visible text of common inline templates; drop the rest (citations, infoboxes, navboxes)."""
    name = " ".join(str(node.name).strip().lower().replace("_", " ").split())
    args = _template_arguments(node) if name in _KEEP_FIRST_ARGUMENT or name in ("convert", "cvt", "lang") \
        or name.startswith("lang-") else []
    if name in ("convert", "cvt") and len(args) >= 2:
        if len(args) >= 4 and args[1] in _RANGE_WORDS:
            out.append(f"{args[0]} {args[1]} {args[2]} {args[3]}")
        else:
            out.append(f"{args[0]} {args[1]}")
    elif name == "lang" and len(args) >= 2:
        out.append(args[1])
    elif (name.startswith("lang-") or name in _KEEP_FIRST_ARGUMENT) and args:
        out.append(args[0])


def _render_wikilink(node: Wikilink, out: list[str]) -> None:
    title = str(node.title).strip()
    visible = title.startswith(":")  # [[:Category:X]] is an ordinary, visible link
    if not visible and ":" in title:
        prefix = title.split(":", 1)[0].strip()
        if prefix.lower() in _HIDDEN_LINK_NAMESPACES:
            return
        # Interlanguage links ([[de:Anarchismus]]) render in the sidebar, not in the text.
        if node.text is None and _INTERLANGUAGE_RE.match(prefix):
            return
    if node.text is not None:
        before = len(out)
        _render(node.text, out)
        if "".join(out[before:]).strip():
            return
        del out[before:]
    # No display text: the link shows its target (entities decoded, without the leading colon
    # and the #section); the pipe trick [[Foo (bar)|]] shows "Foo".
    parts: list[str] = []
    _render(node.title, parts)
    shown = "".join(parts).strip().lstrip(":")
    shown = shown[1:] if shown.startswith("#") else shown.split("#", 1)[0]
    if node.text is not None:
        shown = _TRAILING_PARENS_RE.sub("", shown)
    out.append(shown)


def _strip_sections(wikitext: str) -> list[str]:
    """Split wikitext into the bodies between headings, up to the first non-prose section."""
    bodies, start = [], 0
    for match in _HEADING_RE.finditer(wikitext):
        bodies.append(wikitext[start:match.start()])
        start = match.end()
        if _norm_heading(match.group(2)) in STOP_SECTIONS:
            return bodies
    bodies.append(wikitext[start:])
    return bodies


def _tidy_line(line: str) -> str:
    if "&" in line:
        line = html.unescape(line)  # entities the parser kept as text (e.g. inside link titles)
    line = " ".join(line.split())
    if not line or _JUNK_LINE_RE.match(line):
        return ""
    line = _EMPTY_PARENS_RE.sub("", line)
    line = _OPEN_PAREN_JUNK_RE.sub("(", line)
    line = _SPACE_AFTER_OPEN_RE.sub("(", line)
    line = _SPACE_BEFORE_PUNCT_RE.sub(r"\1", line)
    line = " ".join(line.split())  # again: removed parentheses leave double spaces
    # A line of punctuation alone (what is left of a removed template) is not a paragraph.
    if not any(ch.isalnum() for ch in line):
        return ""
    return line


# mwparserfromhell's tokenizer is quadratic in the number of unclosed constructs (``"{{a|" * 5000``, a
# vandalised or truncated section, stalls a worker). Real articles have a handful; a section with more is
# stripped with linear regexes instead of being parsed.
_MAX_UNCLOSED_BRACKETS = 50
_MAX_UNCLOSED_TAGS = 200
_FALLBACK_TEMPLATE_RE = re.compile(r"\{\{[^{}]*\}\}|\{\|(?:(?!\{\||\|\}).)*\|\}", re.S)
_FALLBACK_LINK_RE = re.compile(r"\[\[([^\[\]]*)\]\]")
_FALLBACK_EXTERNAL_RE = re.compile(r"\[[a-z]+://[^\s\[\]]*\s*([^\[\]]*)\]", re.I)  # a URL ends at a bracket
_FALLBACK_DROPPED_RE = re.compile(
    r"<(math|gallery|code|pre|score|timeline|source|syntaxhighlight|table)\b[^<>]*>"  # attributes end at a "<"
    r"[^<]*(?:<(?!/?\1\b)[^<]*)*</\1\s*>",
    re.S | re.I)
_FALLBACK_MARKUP_RE = re.compile(r"<[^<>\n]{0,300}>|\{\{|\}\}|\[\[|\]\]|\{\||\|\}")
_OPENING_TAG_RE = re.compile(r"<([a-z][a-z0-9]*)\b[^<>]*(?<!/)>", re.I)  # not self-closing
_CLOSING_TAG_RE = re.compile(r"</([a-z][a-z0-9]*)", re.I)


def _is_pathological(body: str) -> bool:
    brackets = (abs(body.count("{{") - body.count("}}")) + abs(body.count("[") - body.count("]"))
                + abs(body.count("{|") - body.count("|}")))
    tags = body.count("<") - 2 * body.count("</") - body.count("/>")
    # Counted by name too: closing tags of another name do not close anything, and an unclosed <nowiki> or <pre>
    # makes the parser rescan the rest of the section ("<nowiki></ref>" * 8000: minutes).
    unclosed = Counter(map(str.lower, _OPENING_TAG_RE.findall(body))) - Counter(
        map(str.lower, _CLOSING_TAG_RE.findall(body)))
    return (brackets > _MAX_UNCLOSED_BRACKETS or tags > _MAX_UNCLOSED_TAGS
            or sum(unclosed.values()) > _MAX_UNCLOSED_TAGS)


def _fallback_link(match: re.Match) -> str:
    title, _, shown = match.group(1).partition("|")
    if ":" in title and title.split(":", 1)[0].strip().lower() in _HIDDEN_LINK_NAMESPACES:
        return ""
    return shown.rsplit("|", 1)[-1] if shown else title


def _strip_markup_linear(body: str) -> str:
    """A rough but linear-time version of ``_render`` for sections the parser would choke on."""
    for _ in range(8):  # innermost templates first; nesting deeper than this is rare
        body, count = _FALLBACK_TEMPLATE_RE.subn("", body)
        if not count:
            break
    body = _FALLBACK_DROPPED_RE.sub("", body)
    for _ in range(2):  # links inside file captions
        body = _FALLBACK_LINK_RE.sub(_fallback_link, body)
    body = _FALLBACK_EXTERNAL_RE.sub(r"\1", body)
    return _FALLBACK_MARKUP_RE.sub(" ", body)


def clean_wikitext(wikitext: str) -> str:
    """Turn an article's wikitext into plain prose paragraphs.

    Templates, references, tables, images, categories, interlanguage links, headings, comments
    and non-prose tags are dropped; links keep their display text, formatting keeps its inner
    text. The article is cut at the first "References"/"See also"/... heading.

    The text is parsed section by section (sections are split on heading lines before parsing):
    headings are dropped anyway, and a pathological construct can only slow the parser down
    within its own section. A section with many unclosed constructs (where the parser's time
    grows quadratically) is cleaned with linear regexes instead.

    Args:
        wikitext: The raw wikitext of one page.

    Returns:
        Paragraphs separated by "\\n"; empty paragraphs are dropped. May be "".
    """
    text = _COMMENT_RE.sub("", wikitext)
    text = _REF_RE.sub("", text)
    out: list[str] = []
    for body in _strip_sections(text):
        if not body.strip():
            continue
        if _is_pathological(body):
            out.append(_strip_markup_linear(body))
        else:
            _render(mwparserfromhell.parse(body), out)
        out.append("\n")
    rendered = _QUOTES_RE.sub("", _MAGIC_WORD_RE.sub("", "".join(out)))
    lines = (_tidy_line(line) for line in rendered.split("\n"))
    return "\n".join(line for line in lines if line)
