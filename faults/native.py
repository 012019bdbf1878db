"""Native writers made visible to the I/O interposer: ``torch.save`` and safetensors ``save_file``.

``torch.save(obj, path)`` writes through torch's C++ zip writer and safetensors'
``save_file`` through Rust: neither passes a Python file object, so
:class:`faults.interposer.Interposer` would see nothing of them. While an interposer
is installed, :class:`NativeWriters` replaces them with wrappers that, for a target
the interposer traces (a path under its root, a traced file of one of its extra
roots, or a new file under one), open it with the traced ``open(path, "wb")`` and
hand that file object on::

    torch.save(obj, path, ...)                 with open(path, "wb") as f:
                                         ->        torch.save(obj, f, ...)   # torch streams into f
    safetensors.torch.save_file(t, path, metadata)
                                         ->    data = safetensors.torch.save(t, metadata)
                                               with open(path, "wb") as f: f.write(data)

(``torch.serialization.save`` and ``safetensors.numpy.save_file`` alike). Each such
file is an ordinary traced open / write ... / close sequence, so before/after/torn
points, ``byte=`` rules, errno rules and power-loss crash states all apply to it, and
its open record says ``"via": "torch.save"`` or ``"via": "safetensors.save_file"``.
Every other call (a file object, which is traced already; a path nothing traces; the
interposer busy or uninstalled) goes to the original function untouched.

Who calls what: ``Interposer.install()`` makes a ``NativeWriters(ix).install()``;
``Interposer.uninstall()`` calls its ``uninstall()``, which puts every original back
(a name still holding a wrapper, bound by ``from torch import save`` meanwhile, then
passes straight through). A module not imported yet is never imported here (a job's
``sitecustomize`` installs the interposer before the job imports torch): a
``sys.meta_path`` finder patches it the moment its import finishes, before the
importing code continues (so ``torch/__init__``'s own ``from torch.serialization
import save`` already binds the wrapper), and is removed on uninstall.

What stays different, said plainly:

- torch names a zip archive's inner folder after the file's stem when given a path
  and ``archive`` when given a file object (as it also does for a non-ASCII path), so
  the bytes differ in those record names; ``torch.load`` reads both alike.
- an error the traced open or close raises (an injected ``eio``/``enospc``) comes back
  as the native writer's own type: ``RuntimeError`` from torch (whose writer already
  turns a failing ``write`` into one), ``SafetensorError`` from safetensors. A real
  failure to open (a missing parent directory, no permission) is left to the original
  function, so its message is the usual one.
- a name bound to the original before the interposer was installed (a module that did
  ``from torch import save`` earlier) is not wrapped; :func:`faults.interposer.untraced_changes`
  still names the files it writes.
"""

from __future__ import annotations

import functools
import io
import os
import sys
import threading

# Imported as every traced rank starts (through faults.interposer): ``inspect`` only when a
# writer is wrapped, ``typing`` only for type checkers, no ``dataclasses``.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import inspect
    from collections.abc import Callable
    from typing import Any

__all__ = ["TARGETS", "NativeWriters"]


class _Target:
    """One function to wrap: ``module.attr``, recorded as ``via``; ``kind`` picks the wrapper."""

    __slots__ = ("module", "attr", "via", "kind")

    def __init__(self, module: str, attr: str, via: str, kind: str) -> None:  # kind: "torch" | "safetensors"
        self.module, self.attr, self.via, self.kind = module, attr, via, kind


TARGETS = (
    _Target("torch.serialization", "save", "torch.save", "torch"),
    _Target("torch", "save", "torch.save", "torch"),
    _Target("safetensors.torch", "save_file", "safetensors.save_file", "safetensors"),
    _Target("safetensors.numpy", "save_file", "safetensors.save_file", "safetensors"),
)


class _AfterImport:
    """A ``sys.meta_path`` finder that lets the other finders find ``names`` and calls
    ``done(name, module)`` right after such a module has executed.

    The module's own loader is kept (``module.__loader__`` is the usual object); only
    its ``exec_module`` is wrapped, on that one loader instance, for that one import.
    """

    def __init__(self, names: set[str], done: Callable[[str, Any], None]) -> None:
        self.names = names
        self.done = done
        self._tls = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.names or getattr(self._tls, "busy", False):
            return None
        self._tls.busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._tls.busy = False
        loader = getattr(spec, "loader", None) if spec is not None else None
        if loader is None or isinstance(loader, type) or not hasattr(loader, "__dict__") \
                or not hasattr(loader, "exec_module"):
            return spec  # a class-level loader (builtin, frozen): nothing to hook safely
        inner = loader.exec_module
        done = self.done

        def exec_module(module: Any) -> None:
            try:
                inner(module)
            finally:
                loader.__dict__.pop("exec_module", None)  # back to the class's own
            done(fullname, module)

        loader.exec_module = exec_module
        return spec

    def invalidate_caches(self) -> None:
        return None


def _torch_error(path: str, exc: OSError) -> RuntimeError:
    return RuntimeError(f"File {path} cannot be written: {exc}")


def _safetensors_error(path: str, exc: OSError) -> Exception:
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - the wrapper exists only where safetensors does
        return RuntimeError(f"Error while serializing: {exc}")
    return SafetensorError(f"Error while serializing: I/O error: {exc.strerror} (os error {exc.errno})")


class NativeWriters:
    """The wrappers of one interposer (see the module docstring)."""

    def __init__(self, ix: Any) -> None:
        self.ix = ix
        self.patched: list[tuple[Any, str, Any, Any]] = []  # (module, attr, original, wrapper)
        self._wrappers: dict[int, Any] = {}  # id(original) -> its wrapper
        self._finder: _AfterImport | None = None

    # ------------------------------------------------------------------ install
    def install(self) -> NativeWriters:
        """Patch what is imported; hook the import of the rest. Never imports anything."""
        waiting: set[str] = set()
        for name in dict.fromkeys(t.module for t in TARGETS):
            mod = sys.modules.get(name)
            if mod is None:
                waiting.add(name)
            else:
                self._patch(name, mod)
        if waiting:
            self._finder = _AfterImport(waiting, self._imported)
            sys.meta_path.insert(0, self._finder)
        return self

    def uninstall(self) -> None:
        """Remove the import hook and restore every original that still holds our wrapper."""
        if self._finder is not None:
            try:
                sys.meta_path.remove(self._finder)
            except ValueError:
                pass
            self._finder = None
        for mod, attr, original, wrapper in reversed(self.patched):
            if getattr(mod, attr, None) is wrapper:
                setattr(mod, attr, original)
        self.patched.clear()

    def _imported(self, name: str, module: Any) -> None:
        if self._finder is not None:
            self._finder.names.discard(name)
        if self.ix._installed:
            self._patch(name, module)

    def _patch(self, name: str, mod: Any) -> None:
        for t in TARGETS:
            if t.module != name:
                continue
            cur = getattr(mod, t.attr, None)
            if cur is None or any(m is mod and a == t.attr for m, a, _o, _w in self.patched):
                continue
            if getattr(cur, "_chaos_native", None) is self:
                # Bound from an already-patched module while it imported (torch/__init__
                # does ``from torch.serialization import save``): restore it too.
                self.patched.append((mod, t.attr, cur.__wrapped__, cur))
                continue
            wrapper = self._wrapper(cur, t, mod)
            if wrapper is None:
                continue
            setattr(mod, t.attr, wrapper)
            self.patched.append((mod, t.attr, cur, wrapper))

    def _wrapper(self, original: Any, t: _Target, mod: Any) -> Any:
        if id(original) in self._wrappers:
            return self._wrappers[id(original)]
        try:
            import inspect

            sig = inspect.signature(original)
        except (TypeError, ValueError):
            return None
        if t.kind == "torch":
            wrapper = self._torch_wrapper(original, sig, t.via)
        else:
            to_bytes = getattr(mod, "save", None)
            if to_bytes is None:
                return None
            wrapper = self._safetensors_wrapper(original, sig, to_bytes, t.via)
        wrapper._chaos_native = self
        self._wrappers[id(original)] = wrapper
        return wrapper

    # ------------------------------------------------------------------ wrappers
    def _target(self, f: Any) -> str | None:
        """The traced path a native writer is asked to write, or None (leave it native)."""
        ix = self.ix
        if not isinstance(f, (str, os.PathLike)) or ix._busy():
            return None
        path = ix._resolve(f, follow=True, create=True)
        if path is None or not os.path.isdir(os.path.dirname(path)):
            return None  # untraced, or a missing parent: the original raises its own error
        return path

    def _traced_file(self, f: Any) -> bool:
        """A file object of a file the interposer traces."""
        try:
            fd = f.fileno()
        except (AttributeError, OSError, ValueError):
            return False
        return not self.ix._busy() and isinstance(fd, int) and fd in self.ix._fds

    def _open(self, f: Any, via: str, err: Callable[[str, OSError], Exception]) -> Any:
        """The traced ``open(f, "wb")``; None when a real failure is the original's to report."""
        ix = self.ix
        fired = len(ix.fired)
        try:
            return ix._open_via(f, "wb", via=via)
        except OSError as exc:
            if len(ix.fired) == fired:
                return None
            raise err(os.fspath(f), exc) from exc

    def _torch_wrapper(self, original: Any, sig: inspect.Signature, via: str) -> Any:
        @functools.wraps(original)
        def save(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError:
                return original(*args, **kwargs)
            f = bound.arguments.get("f")
            legacy = bound.arguments.get("_use_new_zipfile_serialization", True) is False
            if legacy and self._traced_file(f):
                # The legacy format writes tensor data with write(2) on a real file's fileno.
                bound.arguments["f"] = _PythonWrites(f)
                return original(*bound.args, **bound.kwargs)
            if self._target(f) is None:
                return original(*args, **kwargs)
            fobj = self._open(f, via, _torch_error)
            if fobj is None:
                return original(*args, **kwargs)
            bound.arguments["f"] = _PythonWrites(fobj) if legacy else fobj
            try:
                result = original(*bound.args, **bound.kwargs)
            except BaseException:
                _close_quietly(fobj)
                raise
            try:
                fobj.close()
            except OSError as exc:
                raise _torch_error(os.fspath(f), exc) from exc
            return result

        return save

    def _safetensors_wrapper(self, original: Any, sig: inspect.Signature, to_bytes: Any, via: str) -> Any:
        params = list(sig.parameters)
        first = params[0] if params else None

        @functools.wraps(original)
        def save_file(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError:
                return original(*args, **kwargs)
            bound.apply_defaults()
            filename = bound.arguments.get("filename")
            if first is None or self._target(filename) is None:
                return original(*args, **kwargs)
            data = to_bytes(bound.arguments[first], metadata=bound.arguments.get("metadata"))
            fobj = self._open(filename, via, _safetensors_error)
            if fobj is None:
                return original(*args, **kwargs)
            try:
                try:
                    fobj.write(data)
                finally:
                    fobj.close()
            except OSError as exc:
                _close_quietly(fobj)
                raise _safetensors_error(os.fspath(filename), exc) from exc
            return None

        return save_file


class _PythonWrites:
    """A file object without ``fileno``: torch's legacy format then writes tensor data
    through ``write`` (traced) instead of straight to the descriptor (``_should_read_directly``)."""

    def __init__(self, f: Any) -> None:
        self._f = f

    def fileno(self) -> int:
        raise io.UnsupportedOperation("fileno")

    def write(self, b: Any) -> int:
        return self._f.write(b)

    def flush(self) -> None:
        self._f.flush()

    def tell(self) -> int:
        return self._f.tell()

    def seek(self, *args: Any) -> int:
        return self._f.seek(*args)

    def seekable(self) -> bool:
        return self._f.seekable()

    def writable(self) -> bool:
        return True


def _close_quietly(f: Any) -> None:
    try:
        f.close()
    except Exception:  # noqa: BLE001 - the first error is the one that matters
        pass
