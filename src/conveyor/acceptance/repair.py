"""Format repair that never writes content. A model's JSON text may lose two things that carry no content:
a code fence around it (```json ... ```, the closing one may be missing) and trailing commas (``,`` after a
value, right before ``}`` or ``]``, or after the closed value at the end). Those are removed; nothing else is
changed, added or completed.

An answer that ends before its last bracket closes is cut off, and is refused rather than closed: whatever
the last token, the model may have had more to say (``"ultramar`` could be ``"ultramarine"``, ``0.9`` could
be ``0.95``, and after a finished value a list or an object could have gone on), so closing it would publish
a value, a list or a record the model did not finish. A general-purpose repairer (json-repair) completes
such text; this module exists so that it is never done.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

FENCE_OPEN = re.compile(r"\A\s*```[\w+-]*[ \t]*\r?\n")
FENCE_CLOSE = re.compile(r"\r?\n?[ \t]*```\s*\Z")
STRUCTURAL = frozenset("{}[]:,")
OPENING, CLOSING = frozenset("{["), frozenset("}]")
OPENERS = {"}": "{", "]": "["}


@dataclass(frozen=True)
class Token:
    kind: str  # one of STRUCTURAL, '"' for a string, 'atom' for a number or a literal (or junk)
    start: int  # offset in the scanned text
    end: int  # one past the last character; for a string that never closes, the end of the text
    closed: bool = True  # False only for a string that the text ends inside


@dataclass(frozen=True)
class Mended:
    """The text with only its fence and trailing commas removed (``repaired`` says whether any were), or
    ``cut_off``: why the text ends before its value does (then ``text`` is the unchanged input)."""

    text: str
    repaired: bool = False
    cut_off: str | None = None


def mend(text: str) -> Mended:
    """Remove a code fence and trailing commas from ``text``, or say where it is cut off::

        mend('```json\\n{"a": [1, 2,],}\\n```')  # Mended('{"a": [1, 2]}', repaired=True)
        mend('{"a": "ultramar')                  # Mended(..., cut_off="... inside a string ...")
    """
    body, offset = _unfence(text)
    tokens = list(_tokens(body))
    cut = _cut_off(body, tokens, offset)
    if cut:
        return Mended(text, cut_off=cut)
    dropped = _trailing_commas(tokens)
    for start in reversed(dropped):
        body = body[:start] + body[start + 1:]
    return Mended(body, repaired=len(body) != len(text))


def _unfence(text: str) -> tuple[str, int]:
    """The text inside a code fence (the closing one may be missing) and where it starts in ``text``."""
    opening = FENCE_OPEN.match(text)
    if not opening:
        return text, 0
    body = text[opening.end():]
    closing = FENCE_CLOSE.search(body)
    return (body[:closing.start()] if closing else body), opening.end()


def _tokens(text: str) -> Iterator[Token]:
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in STRUCTURAL:
            yield Token(ch, i, i + 1)
            i += 1
        elif ch == '"':
            end = _string_end(text, i)
            yield Token('"', i, n if end is None else end, closed=end is not None)
            i = n if end is None else end
        else:
            start = i
            while i < n and not text[i].isspace() and text[i] not in STRUCTURAL and text[i] != '"':
                i += 1
            yield Token("atom", start, i)


def _string_end(text: str, start: int) -> int | None:
    """One past the closing quote of the string opened at ``start``, or None when the text ends first."""
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == '"':
            return i + 1
        else:
            i += 1
    return None


def _cut_off(body: str, tokens: list[Token], offset: int) -> str | None:
    """Why the text ends before its value does, in one line, or None when every bracket it opens closes
    (it may still not be JSON: json.loads says so)."""
    stack: list[str] = []
    for token in tokens:
        if token.kind in OPENING:
            stack.append(token.kind)
        elif token.kind in CLOSING:
            if not stack or stack[-1] != OPENERS[token.kind]:
                return None  # not a cut: a bracket that does not match, for json.loads to point at
            stack.pop()
    if not tokens or not stack:
        return None
    where = _where(body, tokens, stack, offset)
    left = f"{len(stack)} bracket{'s' if len(stack) > 1 else ''}"
    return f"the answer is cut off {where}, with {left} left open; it is refused, not completed"


def _where(body: str, tokens: list[Token], stack: list[str], offset: int) -> str:
    last = tokens[-1]
    is_key = len(tokens) > 1 and _is_key(tokens, len(tokens) - 1, stack)
    if last.kind == '"' and not last.closed:
        return f"inside {'a key' if is_key else 'a string'} that starts at character {last.start + offset + 1}"
    shown = body[last.start:last.end]
    shown = shown if len(shown) <= 30 else shown[:27] + "..."
    at = f"at character {last.end + offset}"
    if last.kind == '"' and is_key:
        return f"after the key {shown} {at}"
    if last.kind == "atom" and last.end == len(body):  # a number or a word the text ends in may go on
        return f"after {shown} {at} (it may go on)"
    if last.kind in ('"', "atom"):
        return f"after the value {shown} {at} (more may follow it)"
    names = {":": "a colon", ",": "a comma", "{": "an opening brace", "[": "an opening bracket"}
    return f"after {names.get(last.kind, 'a closing bracket')} {at}"


def _is_key(tokens: list[Token], i: int, stack: list[str]) -> bool:
    """Whether the string token ``i`` (the last one) stands where an object expects a key."""
    return bool(stack) and stack[-1] == "{" and tokens[i - 1].kind in ("{", ",")


def _trailing_commas(tokens: list[Token]) -> list[int]:
    """Where the commas are that follow a value and come right before a closing bracket, or after the
    closed object or array at the very end (``{...},``: the value is whole, the comma says nothing)."""
    inner = [t.start for before, t, after in zip(tokens, tokens[1:], tokens[2:], strict=False)
             if t.kind == "," and after.kind in CLOSING and before.kind not in ("{", "[", ":", ",")]
    last = tokens[-2:]
    final = len(last) == 2 and last[0].kind in CLOSING and last[1].kind == ","
    return [*inner, last[1].start] if final else inner
