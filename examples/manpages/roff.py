"""Parse Unix manual pages (man(7) and mdoc(7) roff sources) into small summary dicts."""

from __future__ import annotations

import bz2
import gzip
import lzma
import re
import unicodedata
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class ManPageError(ValueError):
    """Raised when data is not a recognisable manual page."""


_UNPACKERS: tuple[tuple[bytes, Callable[[bytes], bytes]], ...] = (
    (b"\x1f\x8b", gzip.decompress), (b"BZh", bz2.decompress), (b"\xfd7zXZ\x00", lzma.decompress))
_CHARS = {
    "em": "—", "en": "–", "hy": "-", "mi": "-", "-": "-", "aq": "'", "dq": '"', "lq": "“", "rq": "”",
    "oq": "‘", "cq": "’", "Bq": "„", "bq": "‚", "Fo": "«", "Fc": "»", "fo": "‹", "fc": "›", "bu": "•",
    "co": "©", "rg": "®", "tm": "™", "de": "°", "ga": "`", "aa": "´", "ti": "~", "ha": "^", "rs": "\\",
    "sl": "/", "ba": "|", "bv": "|", "or": "|", "ul": "_", "ru": "_", "ss": "ß", "mu": "×", "di": "÷",
    "+-": "±", "->": "→", "<-": "←", ">=": "≥", "<=": "≤", "!=": "≠", "==": "≡", "ua": "↑", "da": "↓",
    "dg": "†", "dd": "‡", "ps": "¶", "sc": "§", "ct": "¢", "Eu": "€", "eu": "€", "Po": "£", "Ye": "¥",
    "if": "∞", "pl": "+", "eq": "=", "ap": "~", "at": "@", "sh": "#", "Do": "$", "lB": "[", "rB": "]",
    "lC": "{", "rC": "}", "la": "⟨", "ra": "⟩", "ae": "æ", "AE": "Æ", "oe": "œ", "OE": "Œ", "/l": "ł",
    "/L": "Ł", "/o": "ø", "/O": "Ø", "-D": "Đ", "Sd": "ð", "TP": "Þ", "Tp": "þ", ".i": "ı", "12": "½",
    "14": "¼", "34": "¾", "r!": "¡", "r?": "¿", "pc": "·", "md": "⋅", "ts": "ς", "sq": "□"}
_GREEK = dict(zip("abgdezyhiklmncoprstufxqw", "αβγδεζηθικλμνξοπρστυφχψω", strict=True))
_ACCENTS = {"'": "\u0301", "`": "\u0300", "^": "\u0302", ":": "\u0308", '"': "\u030b",
            "~": "\u0303", ",": "\u0327", "o": "\u030a", "v": "\u030c"}
_STRINGS = {"R": "®", "Tm": "™", "lq": "“", "rq": "”", "Lq": "“", "Rq": "”", "q": '"', "Ba": "|",
            "Le": "≤", "Ge": "≥", "Lt": "<", "Gt": ">", "Pm": "±", "If": "∞", "Na": "NaN", "Pi": "π",
            "Am": "&", "Ne": "≠", "Ux": "UNIX", "Ua": "↑", "Ye": "¥"}
_SIMPLE = {"\\": "\\", "e": "\\", "E": "\\", "-": "-", " ": " ", "~": " ", "0": " ", "'": "'", "`": "`",
           "t": " ", ".": ".", "_": "_"}
_DROPPED = frozenset("&|^),/:%cadruprz{}!?*\"#\n")
_ESCAPE = re.compile(r"""\\(?:
      (?P<chr>\((?P<c2>..)|\[(?P<cb>[^\]]*)\])
    | (?P<skip>(?:[fFgkmMVY$]|n[-+]?)(?:\[[^\]]*\]|\(..|.)
        | s(?:[-+]?\(\d\d|[-+]?\[[^\]]*\]|[-+]?'[^']*'|[-+]\d|[1-3]\d|\d))
    | (?P<dl>[hvwlLDbxRSHXoZNCAB])(?P<q>.)(?P<arg>.{0,200}?)(?P=q)
    | (?P<one>.)
)""", re.X | re.S)
_STRING_REF = re.compile(r"(?<!\\)((?:\\\\)*)\\\*(?:\[([^\]\s]*)[^\]]*\]|\((..)|(.))")
_COMMENT = re.compile(r'(?<!\\)((?:\\\\)*)\\["#].*', re.S)
_ARG = re.compile(r'"((?:[^"]|"")*)"?|((?:\\.|[^\s\\])+)', re.S)
_REQUEST = re.compile(r"[.'][ \t]*(\\[{}]|[^\s\\]*)[ \t]*(.*)", re.S)
_SEPARATOR = re.compile(r"(?:^|\s)(?:-{1,2}|[—–])(?:\s+|$)")
_PUNCT = re.compile(r"[.,:;)\]?!]+")
_MAX_STRING = 10_000
_NM = "\x01"  # marks an mdoc .Nm line, so consecutive names form one comma-separated list
_BARE_NM = re.compile(_NM + r"(?!\S)")  # .Nm without arguments: the page's own name
_BREAK = "\0"  # marks a paragraph macro inside a man(7) section
_KNOWN_CONDITIONS = {"n": True, "t": False, "\\n(.g": True, "\\n[.g]": True}  # we render like nroff
_NAME_HEADINGS = frozenset({"NAME", "NAMES", "NAME(S)"})
_PARAGRAPH = frozenset({"PP", "LP", "P", "IP", "TP", "TQ", "HP", "SS", "sp", "RS", "INDENT"})
_FONT_MACROS = frozenset({"B", "I", "SM", "SB", "BR", "BI", "IB", "IR", "RB", "RI", "Nm"})
_MDOC_PAIRS = {"Dq": "“”", "Qq": '""', "Sq": "‘’", "Pq": "()", "Aq": "<>", "Bq": "[]", "Brq": "{}",
               "Op": "[]", "Ql": "''"}
_MDOC_OPEN = dict(zip(["Do", "Qo", "So", "Po", "Ao", "Bo", "Bro", "Oo"], "“\"‘(<[{[", strict=True))
_MDOC_CLOSE = dict(zip(["Dc", "Qc", "Sc", "Pc", "Ac", "Bc", "Brc", "Oc"], "”\"’)>]}]", strict=True))
_MDOC_OS = {"Ux": "UNIX", "Bx": "BSD", "Ox": "OpenBSD", "Nx": "NetBSD", "Fx": "FreeBSD", "Dx": "DragonFly",
            "Bsx": "BSD/OS", "At": "AT&T UNIX"}
# mdoc words: macro -> (text, attach to the previous word, glue the next word)
_MDOC_WORDS = {"Ns": ("", True, True), "Pf": ("", True, True), "Ap": ("'", True, True),
               **{m: (c, False, True) for m, c in _MDOC_OPEN.items()},
               **{m: (c, True, False) for m, c in _MDOC_CLOSE.items()},
               **{m: (t, False, False) for m, t in _MDOC_OS.items()}}
_MDOC_CALLABLE = frozenset({
    "Ad", "An", "Ar", "Cd", "Cm", "Dv", "Em", "Er", "Ev", "Fa", "Fn", "Ft", "Ic", "Li", "Lk", "Ms", "Mt",
    "Nm", "No", "Pa", "Sx", "Sy", "Tn", "Va", "Vt", "Ot", "St", "Ex", "Rv", "Eo", "Ec", "Es", "En", "Fl",
    "Xr", *_MDOC_PAIRS, *_MDOC_WORDS})


def decode_source(data: bytes) -> str:
    """Decompress gzip/bzip2/xz data when needed and decode it as UTF-8 (latin-1 fallback)."""
    for magic, unpack in _UNPACKERS:
        if data.startswith(magic):
            try:
                data = unpack(data)
            except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as exc:
                raise ManPageError(f"corrupt compressed data: {exc}") from exc
            break
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    return text.removeprefix("\ufeff")


def _special(name: str) -> str:
    """Render a special character name such as ``em``, ``'e``, ``*a``, ``u00E9`` or ``char65``."""
    if name in _CHARS:
        return _CHARS[name]
    if len(name) == 2 and name[0] == "*" and name[1].lower() in _GREEK:
        greek = _GREEK[name[1].lower()]
        return greek.upper() if name[1].isupper() else greek
    if len(name) == 2 and name[0] in _ACCENTS and name[1].isalpha():
        return unicodedata.normalize("NFC", name[1] + _ACCENTS[name[0]])
    if re.fullmatch(r"u[0-9A-Fa-f]{4,6}(_[0-9A-Fa-f]{4,6})*", name):
        codes = [int(part, 16) for part in name[1:].split("_")]
        return unicodedata.normalize("NFC", "".join(map(chr, codes))) if max(codes) < 0x110000 else ""
    return chr(int(name[4:])) if re.fullmatch(r"char\d{1,5}", name) and int(name[4:]) < 0x110000 else ""


def _plain(text: str) -> str:
    """Replace roff escapes (fonts, sizes, motions, special characters...) with plain characters."""

    def replace(match: re.Match[str]) -> str:
        if match["chr"]:
            return _special(match["c2"] or match["cb"] or "")
        if match["skip"]:
            return ""
        if match["dl"]:
            kind, arg = match["dl"], match["arg"]
            if kind == "N" and arg.isdigit() and int(arg) < 0x110000:
                return chr(int(arg))
            return _special(arg) if kind == "C" else _plain(arg) if kind in "oZ" else ""
        return _SIMPLE.get(match["one"], "" if match["one"] in _DROPPED else match["one"])

    return _ESCAPE.sub(replace, text)


def _split_args(text: str) -> list[tuple[str, bool]]:
    """Split a request's argument string into ``(argument, was_quoted)`` pairs."""
    return [(m[1].replace('""', '"'), True) if m[1] is not None else (m[2], False)
            for m in _ARG.finditer(text)]


def _join(out: str, word: str, glue: bool) -> str:
    """Append ``word`` to ``out`` with a separating space unless glued."""
    return out + (" " if out and not glue else "") + word


def _mdoc_inline(args: list[tuple[str, bool]]) -> str:
    """Render mdoc macro arguments (``Fl``, ``Xr``, ``Dq``, ``Ns``...) as plain text."""
    args, out, closers, tail, glue, i = list(args), "", [], "", False, 0
    while args and not args[-1][1] and _PUNCT.fullmatch(args[-1][0]):
        tail = args.pop()[0] + tail
    while i < len(args):
        (tok, quoted), i = args[i], i + 1
        macro = "" if quoted else tok
        if macro in _MDOC_PAIRS:
            out, glue = _join(out, _MDOC_PAIRS[macro][0], glue), True
            closers.append(_MDOC_PAIRS[macro][1])
        elif macro in _MDOC_WORDS:
            text, attach, next_glue = _MDOC_WORDS[macro]
            out, glue = (out + text if attach else _join(out, text, glue)), next_glue
        elif macro == "Fl":
            nxt = args[i][0] if i < len(args) and args[i][0] not in _MDOC_CALLABLE else ""
            out, glue, i = _join(out, "-" + _plain(nxt), glue), False, i + bool(nxt)
        elif macro == "Xr" and i + 1 < len(args):
            ref = f"{_plain(args[i][0])}({_plain(args[i + 1][0])})"
            out, glue, i = _join(out, ref, glue), False, i + 2
        elif macro not in _MDOC_CALLABLE:
            word = _plain(tok)
            out = out + word if not quoted and _PUNCT.fullmatch(word) else _join(out, word, glue)
            glue = word in ("(", "[")
    return out + "".join(reversed(closers)) + tail


@dataclass
class _Parser:
    """Single-pass line state machine over a roff document (a tiny, forgiving nroff subset)."""

    fmt: str = ""
    title: str = ""
    section: str = ""
    redirect: str | None = None
    sections: list[tuple[str, list[str]]] = field(default_factory=list)  # (heading, text lines)
    strings: dict[str, str] = field(default_factory=dict)
    skip_until: str | None = None
    depth: int = 0
    block_truth: bool | None = None
    last_ie: bool | None = None
    pending_heading: bool = False
    nesting: int = 0

    def interpolate(self, line: str) -> str:
        """Expand ``\\*x``, ``\\*(xx`` and ``\\*[name]`` string references (bounded)."""
        def value(m: re.Match[str]) -> str:
            name = m[2] if m[2] is not None else m[3] or m[4]
            return m[1] + self.strings.get(name, _STRINGS.get(name, ""))

        for _ in range(4):
            line, count = _STRING_REF.subn(value, line)
            if not count or len(line) > _MAX_STRING:
                break
        return line

    def feed(self, line: str) -> None:
        """Process one logical source line, honouring ``.de``/``.ig`` skips and ``\\{ \\}`` blocks."""
        match = _REQUEST.fullmatch(line)
        if self.skip_until is not None:
            if match and match[1] == self.skip_until:
                self.skip_until = None
        elif self.depth > 0:
            self.depth = max(0, self.depth + line.count("\\{") - line.count("\\}"))
            self.conditional(line.replace("\\}", ""), self.block_truth)
        else:
            self.execute(line)

    def execute(self, line: str) -> None:
        """Interpolate strings, then dispatch the line as a request or as running text."""
        line = self.interpolate(line)
        match = _REQUEST.fullmatch(line)
        if match is None:
            self.text(_plain(line))
        else:
            self.request(match[1], match[2])

    def conditional(self, body: str, truth: bool | None) -> None:
        """Run a conditional body: fully when true, only new definitions when unknown."""
        match = _REQUEST.fullmatch(body)
        if truth and body.strip() and self.nesting < 16:
            self.nesting += 1
            self.execute(body)
            self.nesting -= 1
        elif match and match[1] in ("de", "am"):
            self.request(match[1], match[2])
        elif match and truth is None and match[1] in ("ds", "as"):
            name = (_split_args(match[2]) or [("", False)])[0][0]
            if name not in self.strings:
                self.request(match[1], self.interpolate(match[2]))

    def request(self, name: str, rest: str) -> None:
        """Handle a control line ``.name rest``."""
        args = _split_args(rest)
        words = [_plain(arg).strip() for arg, _ in args]
        if name in ("TH", "Dt") and not self.title:
            self.fmt = "man" if name == "TH" else "mdoc"
            self.title, self.section = [*words, "", ""][:2]
        elif name in ("SH", "Sh"):
            self.fmt = self.fmt or ("man" if name == "SH" else "mdoc")
            heading = (_mdoc_inline(args) if name == "Sh" else " ".join(words)).strip()
            self.sections.append((heading, []))
            self.pending_heading = not heading
        elif name in ("de", "am", "ig", "de1", "am1"):
            end_index = 0 if name == "ig" else 1
            self.skip_until = words[end_index] if len(words) > end_index else "."
        elif name in ("ds", "as", "ds1", "as1") and args:
            value = [*rest.split(None, 1), ""][1].removeprefix('"')
            value = (self.strings.get(args[0][0], "") if name[0] == "a" else "") + value
            self.strings[args[0][0]] = value[:_MAX_STRING]
        elif name in ("if", "ie", "el"):
            self.branch(name, rest)
        elif name == "so" and words and not self.title and self.redirect is None:
            self.redirect = words[0]
        elif name in _FONT_MACROS and self.fmt != "mdoc":
            self.text(("" if len(name) == 2 and name not in ("SM", "SB", "Nm") else " ").join(words))
        elif name in _MDOC_CALLABLE or name == "Nd":
            rendered = _mdoc_inline(args if name == "Nd" else [(name, False), *args])
            self.text({"Nd": "- ", "Nm": _NM}.get(name, "") + rendered)
        elif name in _PARAGRAPH and self.sections and self.fmt == "man":
            self.sections[-1][1].append(_BREAK)

    def branch(self, name: str, rest: str) -> None:
        """Handle ``.if``/``.ie``/``.el``, tracking ``\\{ ... \\}`` blocks."""
        if name == "el":
            body, truth = rest, None if self.last_ie is None else not self.last_ie
        else:
            cond, body = [*rest.split(None, 1), ""][:2]
            truth = _KNOWN_CONDITIONS.get(cond.removeprefix("!"))
            truth = None if truth is None else truth != cond.startswith("!")
            self.last_ie = truth if name == "ie" else self.last_ie
        opened = body.count("\\{") - body.count("\\}")
        self.block_truth = truth if opened > 0 else self.block_truth
        self.depth = max(0, self.depth + opened)
        self.conditional(body.replace("\\{", "").replace("\\}", "").lstrip(), truth)

    def text(self, line: str) -> None:
        """Handle a line of running text."""
        if not self.sections or not line.strip():
            return
        if self.pending_heading:
            self.sections[-1], self.pending_heading = (line.strip(), self.sections[-1][1]), False
        else:
            self.sections[-1][1].append(line)


def _logical_lines(text: str) -> list[str]:
    """Split source into comment-free lines, joining lines that end in an escaped newline."""
    lines: list[str] = []
    pending = ""
    for raw in text.replace("\r\n", "\n").split("\n"):
        raw = _COMMENT.sub(r"\1", raw)
        if (len(raw) - len(raw.rstrip("\\"))) % 2:
            pending += raw[:-1]
            continue
        lines.append(pending + raw)
        pending = ""
    return [*lines, pending] if pending else lines


def _name_entries(lines: list[str], bare_names: bool = True) -> tuple[list[str], str]:
    """Split NAME lines (``a, b \\- text``) into names and the first entry's description."""
    prefix: list[str] = []
    names: list[str] = []
    description: list[str] = []
    entries, broken = 0, False
    for line in lines:
        match = _SEPARATOR.search(line)
        if line == _BREAK:
            broken = entries > 0
        elif match:
            head = " ".join([*prefix, line[:match.start()]]).replace(_NM, ",").split(",")
            if broken and any(len(n.split()) > 1 for n in head):
                break
            names += head
            description += [line[match.end():]] if entries == 0 else []
            prefix, entries = [], entries + 1
        elif entries == 1 and not broken:
            description.append(line)
        elif entries == 0:
            prefix.append(line)
    if not names and prefix and bare_names:
        names = " ".join(prefix).replace(_NM, ",").split(",")
    text = " ".join(" ".join(description).replace(_NM, "").split())
    return [" ".join(n.split()) for n in names if n.strip()], text


def _summary(sections: list[tuple[str, list[str]]]) -> tuple[list[str], str]:
    """Read the NAME section, else a first section that holds ``name \\- text`` (translated pages)."""
    named = [lines for heading, lines in sections if heading.upper() in _NAME_HEADINGS]
    if named or not sections:
        return _name_entries(named[0] if named else [])
    return _name_entries(sections[0][1], bare_names=False)


def _body(sections: list[tuple[str, list[str]]], name: str, max_chars: int) -> str:
    """The page's running text: each heading on its own line, then its paragraphs, cut at ``max_chars``.
    A bare mdoc ``.Nm`` stands for the page's ``name``."""
    blocks: list[str] = []
    size = 0
    for heading, lines in sections:
        joined = _BARE_NM.sub(lambda _: name, " ".join(lines)).replace(_NM, "")
        paragraphs = joined.split(_BREAK)
        text = "\n".join(p for p in (" ".join(par.split()) for par in paragraphs) if p)
        block = f"{heading}\n{text}" if text else heading
        blocks.append(block)
        size += len(block) + 2
        if size >= max_chars:
            break
    return "\n\n".join(blocks)[:max_chars].rstrip()


def parse_manpage(text: str, *, body_chars: int = 0) -> dict[str, Any]:
    """Parse roff source into title, section, names, description, format, headings and redirect.

    With ``body_chars`` > 0 the result also has ``body``: the page's plain running text
    (headings and paragraphs), at most that many characters.
    """
    try:
        parser = _Parser()
        for line in _logical_lines(text):
            parser.feed(line)
        if parser.redirect is not None and not parser.title:
            return {"title": "", "section": "", "names": [], "description": "", "format": "man",
                    "headings": [], "redirect": parser.redirect}
        names, description = _summary(parser.sections)
    except Exception as exc:  # contract: malformed input only ever raises ManPageError
        detail = " ".join(str(exc).split())
        raise ManPageError(f"unparseable manual page: {type(exc).__name__}: {detail}") from exc
    if not parser.title:
        raise ManPageError("no .TH/.Dt title line found")
    if not names:
        raise ManPageError("no NAME section with command names found")
    result = {"title": parser.title, "section": parser.section, "names": list(dict.fromkeys(names)),
              "description": description, "format": parser.fmt,
              "headings": [heading for heading, _ in parser.sections], "redirect": None}
    if body_chars > 0:
        result["body"] = _body(parser.sections, result["names"][0], body_chars)
    return result
