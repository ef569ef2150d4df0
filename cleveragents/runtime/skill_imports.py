"""Import a python tool's module from its skill folder first, one namespace per folder.

A skill folder is a unit you can copy: its python tools' modules sit beside the
skill file, and must import from there wherever the folder is and whatever the
worker's current folder. Putting the folder on ``sys.path`` would not do:
``sys.modules`` is keyed by module name, so the ``tools.py`` of the first skill
folder imported would be every other folder's ``tools`` too.

So every skill folder gets a package of its own, under a name no one writes:
``_cleveragents_skills.<folder name>_<hash of its path>``, whose ``__path__`` is
the folder. A module of the folder is imported as a submodule of that package
(``tools`` of ``/srv/a`` is ``_cleveragents_skills.a_1f2e3d4c.tools``): two
folders' ``tools.py`` are two modules, and no plain name is ever taken in
``sys.modules``. Packages of the folder, and relative imports inside them, work
as usual.

Absolute imports between the folder's own modules (``import helpers`` in
``tools.py``) work too, at module level and inside functions alike: every module
loaded from a skill folder runs with a ``__builtins__`` of its own whose
``__import__`` first looks for the imported top-level name in that folder (a
module, or a package with ``__init__.py``) and imports it from the folder's
package; any other name (the standard library, installed packages,
``PYTHONPATH``) imports as it always has. No global hook, no ``sys.path``
change: code outside skill folders is untouched, and so is the speed of its
imports. A meta path finder (installed once, at the first activation) answers
only for names under ``_cleveragents_skills.``.

Limits: ``importlib.import_module("helpers")`` inside a skill module does not go
through ``__import__``: use ``import helpers``, or
``importlib.import_module(".helpers", __package__)``. A builtin module (``sys``)
cannot be shadowed, as with ``sys.path``; folders without ``__init__.py``
(namespace packages) are not looked for. Objects of skill modules pickle by
their package name, which only this process knows. The folder's ``__builtins__``
is a copy taken when the folder is first used: a later patch of ``builtins``
does not reach its modules.
"""

from __future__ import annotations

import builtins
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import re
import sys
import threading
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["ROOT_PACKAGE", "import_from_folder", "package_for"]

#: The package every skill folder's own package lives under.
ROOT_PACKAGE = "_cleveragents_skills"

_lock = threading.Lock()
_packages: dict[Path, str] = {}  # skill folder -> its package's name


class _Space:
    """One skill folder's package, and the ``__import__`` its modules see."""

    def __init__(self, folder: Path, package: str) -> None:
        self.folder = folder
        self.package = package
        self.builtins = {**builtins.__dict__, "__import__": self.import_}

    def owns(self, top: str) -> bool:
        """The folder holds a module or a regular package called ``top``."""
        if top in sys.builtin_module_names:
            return False
        if f"{self.package}.{top}" in sys.modules:
            return True
        spec = importlib.machinery.PathFinder.find_spec(top, [str(self.folder)])
        return spec is not None and spec.origin is not None  # not a namespace package

    def import_(
        self,
        name: str,
        globals: dict[str, Any] | None = None,  # __import__'s own names
        locals: Any = None,
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> types.ModuleType:
        """``builtins.__import__``, with the folder's own top-level names taken from the folder."""
        if level == 0 and name and self.owns(name.partition(".")[0]):
            module = builtins.__import__(f"{self.package}.{name}", globals, locals, fromlist, 0)
            if fromlist:
                return module
            return sys.modules[f"{self.package}.{name.partition('.')[0]}"]
        return builtins.__import__(name, globals, locals, fromlist or (), level)


_spaces: dict[str, _Space] = {}  # package name -> its space


class _FolderLoader(importlib.abc.Loader):
    """The usual loader of a skill folder's file, run with the folder's ``__builtins__``."""

    def __init__(self, inner: Any, space: _Space) -> None:
        self._inner = inner
        self._space = space

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._inner.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__["__builtins__"] = self._space.builtins
        self._inner.exec_module(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ...
        if name == "_inner":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self._inner, name)


class _FolderFinder(importlib.abc.MetaPathFinder):
    """Finds the submodules of the skill-folder packages, and only those."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(ROOT_PACKAGE + "."):
            return None
        space = _spaces.get(".".join(fullname.split(".", 2)[:2]))
        if space is None or path is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _FolderLoader(spec.loader, space)
        return spec


_FINDER = _FolderFinder()


def _package_name(folder: Path) -> str:
    slug = re.sub(r"\W", "_", folder.name, flags=re.ASCII).strip("_") or "skills"
    digest = hashlib.sha256(str(folder).encode()).hexdigest()[:8]
    return f"{slug}_{digest}"


def package_for(folder: Path) -> str:
    """The package the modules of ``folder`` are imported under (made the first time)."""
    folder = folder.absolute()
    with _lock:
        package = _packages.get(folder)
        if package is not None and package in sys.modules:
            return package
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
        root = sys.modules.get(ROOT_PACKAGE)
        if root is None:
            root = types.ModuleType(ROOT_PACKAGE, "Python tools' modules, a package a skill folder")
            root.__path__ = []
            sys.modules[ROOT_PACKAGE] = root
        package = package or f"{ROOT_PACKAGE}.{_package_name(folder)}"
        space = _spaces.get(package) or _Space(folder, package)
        module = types.ModuleType(package, f"the modules of the skill folder {folder}")
        module.__path__ = [str(folder)]
        module.__package__ = package
        _spaces[package] = space
        sys.modules[package] = module
        setattr(root, package.rpartition(".")[2], module)
        _packages[folder] = package
        return package


def import_from_folder(module_name: str, folder: Path | None) -> types.ModuleType:
    """Import ``module_name`` from ``folder`` when the folder holds it, else as usual.

    Raises:
        ImportError: neither the folder nor the path has the module; or whatever the
            module raises while it is imported.
    """
    if folder is None:
        return importlib.import_module(module_name)
    package = package_for(folder)
    space = _spaces[package]
    if space.owns(module_name.partition(".")[0]):
        return importlib.import_module(f"{package}.{module_name}")
    return importlib.import_module(module_name)
