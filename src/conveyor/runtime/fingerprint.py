"""A fingerprint of a stage function's code, recorded with every output it makes.

A memoised output is keyed by the stage's declared ``version``, so editing the
code without bumping it would silently reuse what the old code made. The
fingerprint lets a run notice that and say so (``stale_code``).

It is taken from the function's syntax tree when its source is available:
comments, blank lines, formatting, the docstring and the decorator (whose
options have keys of their own) do not change it; a changed expression,
name or constant does. Without source (a function built at run time) it
falls back to the compiled code. Only the stage function itself is covered,
not helpers it calls from other functions or modules: bump ``version`` when
those change what the stage returns.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import marshal
import textwrap
import types
from collections.abc import Callable
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1024)
def code_fingerprint(fn: Callable[..., Any]) -> str:
    """16 hex digits that change when the function's code changes."""
    text = _syntax(fn)
    data = text.encode() if text is not None else _compiled(fn)
    return hashlib.sha256(data).hexdigest()[:16]


def _syntax(fn: Callable[..., Any]) -> str | None:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    node = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == getattr(fn, "__name__", None)), None)
    if node is None:
        return None
    node.decorator_list, node.name = [], ""  # options and the stage's name are in the task key already
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        node.body = body[1:] or [ast.Pass()]
    return ast.dump(node, annotate_fields=False, include_attributes=False)


def _compiled(fn: Callable[..., Any]) -> bytes:
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        return repr(fn).encode()
    return marshal.dumps(code.replace(co_filename="", co_firstlineno=1, co_linetable=b""))
