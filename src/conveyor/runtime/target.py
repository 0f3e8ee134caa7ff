"""Load a pipeline from a TARGET: ``path/to/file.py:name`` or ``package.module:name``."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path

from conveyor.errors import ConveyorError, TargetError
from conveyor.pipeline import Pipeline

_cache: dict[str, Pipeline] = {}
_loading: list[str] = []  # the targets being imported now (innermost last)
_FILE_MODULE = "conveyor_target_"  # the module name of a pipeline file load_target imports (and a hash of its path)


def load_target(target: str) -> Pipeline:
    """Import the module named by ``target`` and return its Pipeline object."""
    if target in _cache:
        return _cache[target]
    module_ref, sep, attr = target.rpartition(":")
    if not sep or not module_ref or not attr:
        raise TargetError(f"TARGET {target!r} must look like file.py:pipeline or package.module:pipeline")
    _loading.append(target)
    try:
        module = _import(module_ref, target)
    finally:
        _loading.pop()
    obj = getattr(module, attr, None)
    if obj is None:
        raise TargetError(f"{module_ref} has no attribute {attr!r}; name the Pipeline object after the colon")
    if not isinstance(obj, Pipeline):
        raise TargetError(f"{target} is a {type(obj).__name__}, not a conveyor Pipeline")
    _cache[target] = obj.validate()
    return obj


def loading_target() -> str | None:
    """The TARGET whose module is being imported now, if any: code it runs at import (a script's ``pipe.run(...)``
    outside ``if __name__ == "__main__":``) must not start a run in every worker that loads it."""
    return _loading[-1] if _loading else None


def target_of(pipeline: Pipeline) -> str | None:
    """A TARGET that loads ``pipeline`` in another process (a worker): ``file.py:name`` for a pipeline declared in
    a file run as a script, loaded by ``load_target`` or imported as a top-level module (``import products``),
    ``package.module:name`` for one in a package;
    None for one no other process can import (declared in a notebook cell or at the interactive prompt). Found by
    the module of its stages' functions and the module attribute that holds it."""
    for stage in pipeline:
        module = sys.modules.get(getattr(stage.fn, "__module__", "") or "")
        name = next((attr for attr, value in vars(module).items() if value is pipeline), None) if module else None
        if module is None or name is None:
            continue
        file = getattr(module, "__file__", None)
        if module.__name__ == "__main__" or module.__name__.startswith(_FILE_MODULE):
            return f"{os.path.abspath(file)}:{name}" if file and os.path.isfile(file) else None
        if "." not in module.__name__ and file and file.endswith(".py") and os.path.isfile(file):
            # A module of its own (a script's neighbour, found through a sys.path entry the script made): a worker,
            # whose sys.path is its own, loads it by its file (which puts its folder on the path, as here).
            return f"{os.path.abspath(file)}:{name}"
        return f"{module.__name__}:{name}"
    return None


def absolute_target(target: str) -> str:
    """``target`` with its file made absolute, so it loads the same from any folder (a module stays)."""
    module_ref, _, attr = target.rpartition(":")
    if module_ref.endswith(".py") or "/" in module_ref:
        return f"{os.path.abspath(module_ref)}:{attr}"
    return target


def _import(module_ref: str, target: str) -> object:
    if module_ref.endswith(".py") or "/" in module_ref:
        return _import_file(Path(module_ref), target)
    try:
        return importlib.import_module(module_ref)
    except ModuleNotFoundError as exc:
        raise TargetError(f"cannot import module {module_ref!r} ({exc}); check TARGET and PYTHONPATH") from None


def _import_file(path: Path, target: str) -> object:
    if not path.is_file():
        raise TargetError(f"pipeline file {str(path)!r} does not exist (TARGET {target!r})")
    resolved = path.resolve()
    name = _FILE_MODULE + hashlib.sha256(str(resolved).encode()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot load {str(path)!r} as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(resolved.parent))
    try:
        spec.loader.exec_module(module)
    except ConveyorError:
        del sys.modules[name]
        raise
    except Exception as exc:
        del sys.modules[name]
        raise TargetError(f"importing {path} failed: {_where(exc, resolved)}") from exc
    except SystemExit as exc:
        del sys.modules[name]
        raise TargetError(f"importing {path} called sys.exit({exc.code!r}); a pipeline file must not exit when "
                          "imported: put script code under `if __name__ == \"__main__\":`") from None
    return module


def _where(exc: Exception, path: Path) -> str:
    """The error and the line of the pipeline file it came from, in one line."""
    if isinstance(exc, SyntaxError):
        return f"SyntaxError at line {exc.lineno}: {exc.msg}"
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(path)]
    at = f" (line {lines[-1]})" if lines else ""
    return f"{type(exc).__name__}: {exc}{at}"
