"""Loading cached kernels lighter: what numba does on a cache hit that a warm start pays for.

`install()` (called once by kernels/jit.py, before any kernel loads) changes two things in
how numba loads a kernel from its on-disk cache, and one in how it saves one; compiling is
unchanged.

- numba's `Cache.load_overload` refreshes the target context before every load: the first
  time, that imports and installs every lowering registry numba has (a visible share of a
  warm start's time and memory), which only compiling uses. The compiler refreshes the
  contexts itself (`CompilerBase.__init__`), so a cache miss still compiles as before; a
  hit needs only numba's runtime (NRT), which is initialized here.
- A library loaded from the cache keeps its LLVM module for linking (`_shared_module`,
  parsed from the cached bitcode: ~5 MiB for the fused decode step), used only if a later
  compile links against it. The bitcode is kept instead (~15x smaller) and parsed again on
  that first use.

- Saving (`IndexDataCacheFile.save`) is made safe between processes. numba names a new
  entry's data file by the count of entries in the index it has just read, writes the index,
  then the data: two processes compiling two signatures of one kernel at once (the test
  suite's two workers on a cold cache; a server and a CLI started together) can both pick
  `name.1.nbc`, and the index can end up mapping one signature to the other's code, which
  then runs for it. Here a data file is named by a hash of its key (two keys never share a
  file), the data is written before the index entry that names it, and the index is read,
  updated and written under a lock on a file beside it (no entry lost).
- Compiling: one process at a time compiles a given signature of a kernel. On a cache miss a
  process takes a lock on that signature (a byte of a `.compiling` file beside the kernel's
  index, at an offset given by the key's hash); a second process missing the same signature
  meanwhile waits for it, then loads the first one's saved code instead of compiling it
  again (the test suite's two workers on a cold cache; a server and a CLI started together).
  The lock is the operating system's (fcntl): a process that dies holding it releases it, and
  a wait gives up after WAIT_S seconds (then it compiles, as numba would).

Each change is made only where numba has the internals it relies on (checked here;
numba 0.61-0.68 do); otherwise numba is left as it is and loads as before.
"""

from __future__ import annotations

__all__ = ["WAIT_S", "install", "installed"]

_INSTALLED: list[str] = []
WAIT_S = 1200.0  # longest wait for another process's compile of a signature (then compile)


def installed() -> tuple[str, ...]:
    """The changes install() made: "lazy-refresh", "bitcode-for-linking", "keyed-saves",
    "compile-locks"."""
    return tuple(_INSTALLED)


def install() -> None:
    """Make both changes where numba allows (idempotent)."""
    if _INSTALLED:
        return
    try:
        from numba.core import caching, codegen
        from numba.core.runtime import rtsys
    except ImportError:
        return
    cache = caching.Cache
    if all(hasattr(cache, n) for n in ("load_overload", "_load_overload",
                                       "_guard_against_spurious_io_errors")) \
            and hasattr(rtsys, "initialize"):
        def load_overload(self, sig, target_context):
            """numba's, without the registries' refresh: loading needs only the NRT."""
            rtsys.initialize(target_context)
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)

        cache.load_overload = load_overload
        _INSTALLED.append("lazy-refresh")

    _keyed_saves(caching)
    _compile_locks(caching)
    lib = getattr(codegen, "JITCodeLibrary", None)
    base = getattr(codegen, "CPUCodeLibrary", None)
    if lib is None or base is None or not hasattr(lib, "_unserialize") \
            or not hasattr(base, "_get_module_for_linking"):
        return
    unserialize = lib._unserialize.__func__
    get_module = base._get_module_for_linking
    parse = codegen.ll.parse_bitcode

    def _unserialize(cls, codegen_, state):
        self = unserialize(cls, codegen_, state)
        _name, kind, data = state
        if kind == "object" and getattr(self, "_shared_module", None) is not None:
            self._edgellm_bitcode = data[1]  # parsed again if a compile links this library
            self._shared_module = None
        return self

    def _get_module_for_linking(self):
        bitcode = getattr(self, "_edgellm_bitcode", None)
        if bitcode is not None and self._shared_module is None:
            self._shared_module = parse(bitcode)
            self._edgellm_bitcode = None
        return get_module(self)

    lib._unserialize = classmethod(_unserialize)
    base._get_module_for_linking = _get_module_for_linking
    _INSTALLED.append("bitcode-for-linking")


def _keyed_saves(caching) -> None:
    """IndexDataCacheFile.save, safe between processes (the module docstring)."""
    import contextlib
    import hashlib

    files = getattr(caching, "IndexDataCacheFile", None)
    if files is None or not all(hasattr(files, n) for n in (
            "save", "_load_index", "_save_index", "_save_data", "_data_name")):
        return
    try:
        import fcntl
    except ImportError:  # Windows: keyed names still keep each key's code its own
        fcntl = None

    @contextlib.contextmanager
    def locked(path):
        if fcntl is None:
            yield
            return
        with open(path + ".lock", "a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def save(self, key, data):
        """Save *data* under *key*: its own data file, then the index entry, under a lock."""
        # repr: the types' names (numba's identity for types), the CPU, the code's hashes
        digest = hashlib.sha256(repr(key).encode()).digest()
        name = self._data_name(int.from_bytes(digest[:7], "little"))
        with locked(self._index_path):
            self._save_data(name, data)
            overloads = self._load_index()
            overloads[key] = name
            self._save_index(overloads)

    files.save = save
    _INSTALLED.append("keyed-saves")


def _compile_locks(caching) -> None:
    """One process compiles a signature at a time (the module docstring).

    Dispatcher.compile asks the cache for a signature, compiles on a miss and saves: a miss
    inside it takes the signature's lock (waiting while another process holds it, then
    asking the cache again), and the lock is let go when that compile returns or raises,
    after its save."""
    import errno
    import hashlib
    import os
    import time

    try:
        import fcntl
    except ImportError:  # Windows: both compile, as numba does
        return
    from numba.core import dispatcher
    from numba.core.compiler_lock import global_compiler_lock

    cache, disp = caching.Cache, getattr(dispatcher, "Dispatcher", None)
    if disp is None or not hasattr(disp, "compile") or not all(
            hasattr(cache, n) for n in ("load_overload", "_index_key")):
        return
    load_overload, compile_ = cache.load_overload, disp.compile
    # Held locks, (path, offset), and each file's descriptor with its count of them: POSIX
    # locks are the process's, and closing any descriptor of the file drops them all.
    held: list[tuple[str, int]] = []
    files: dict[str, list[int]] = {}
    active = [0]  # Dispatcher.compile calls under way in this process

    def claim(self, sig, target_context) -> tuple[str, int] | None:
        """Lock `sig`'s byte of the kernel's `.compiling` file (waiting up to WAIT_S)."""
        index = getattr(getattr(self, "_cache_file", None), "_index_path", None)
        if index is None or not getattr(self, "_enabled", True):
            return None
        key = repr(self._index_key(sig, target_context.codegen()))
        offset = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little") >> 1
        path = index + ".compiling"
        if path not in files:
            try:
                self._impl.locator.ensure_cache_path()
                files[path] = [os.open(path, os.O_RDWR | os.O_CREAT, 0o666), 0]
            except (OSError, AttributeError):
                return None
        entry = files[path]
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                fcntl.lockf(entry[0], fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
                entry[1] += 1
                return path, offset
            except OSError as e:
                # held by another process: wait; no locks on this file system: go on
                if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    if entry[1] == 0:
                        os.close(files.pop(path)[0])
                    return None
                time.sleep(0.05)

    def release(lock: tuple[str, int]) -> None:
        path, offset = lock
        entry = files[path]
        fcntl.lockf(entry[0], fcntl.LOCK_UN, 1, offset)
        entry[1] -= 1
        if entry[1] == 0:
            os.close(files.pop(path)[0])

    def load_or_claim(self, sig, target_context):
        """numba's load; on a miss during a compile, the signature's lock, then load again
        (the code another process compiled while this one waited)."""
        cres = load_overload(self, sig, target_context)
        if cres is not None or not active[0]:
            return cres
        lock = claim(self, sig, target_context)
        if lock is None:
            return None
        cres = load_overload(self, sig, target_context)
        if cres is not None:
            release(lock)
        else:
            held.append(lock)  # this process compiles it: let go once saved (compile below)
        return cres

    def compile(self, sig):
        """numba's, letting go of the locks its cache misses took once it has saved."""
        with global_compiler_lock:  # one thread compiles at a time: `held` is its stack
            depth = len(held)
            active[0] += 1
            try:
                return compile_(self, sig)
            finally:
                active[0] -= 1
                while len(held) > depth:
                    release(held.pop())

    cache.load_overload = load_or_claim
    disp.compile = compile
    _INSTALLED.append("compile-locks")
