"""pinguard from Python.

The wheel carries the preload library and the ``pinguard`` command; ``pinguard run -- python
train.py`` (or ``python -m pinguard run -- ...``) runs a program under it. Inside such a program
these functions read pinguard's own figures; outside one they say so (``None`` or an exception)
and never load the library themselves.

    import pinguard
    report = pinguard.load_report()          # a snapshot of this process, as a dict
    print(report["totals"]["live_bytes"], pinguard.report_path())
"""

import ctypes
import json
import os

__version__ = "0.1.0"
__all__ = ["active", "command_path", "library_path", "live_bytes", "load_report", "peak_bytes", "peak_window_bytes", "peak_window_start", "report_path", "write_report"]

_HERE = os.path.dirname(os.path.abspath(__file__))


def library_path():
    """The preload library inside this package (what ``LD_PRELOAD`` takes)."""
    return os.path.join(_HERE, "_bin", "libpinguard.so")


def command_path():
    """The ``pinguard`` command inside this package."""
    return os.path.join(_HERE, "_bin", "pinguard")


def _api(name, restype, argtypes):
    """A function of pinguard's C API when this process runs with the library, else None.
    Looked up in the global scope, where an ``LD_PRELOAD``ed library is."""
    try:
        fn = getattr(ctypes.CDLL(None), name)
    except (AttributeError, OSError):
        return None
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


def active():
    """Whether this process runs with pinguard loaded."""
    return _api("pinguard_version", ctypes.c_char_p, []) is not None


def report_path():
    """Where this process's report goes (the exit report, and ``write_report()``), or None when
    pinguard is not loaded (or is disabled)."""
    fn = _api("pinguard_common_path", ctypes.c_long, [ctypes.c_char_p, ctypes.c_size_t])
    if fn is None:
        return None
    n = fn(None, 0)
    if n < 0:
        return None
    buf = ctypes.create_string_buffer(n + 1)
    fn(buf, n + 1)
    return os.fsdecode(buf.value)


def live_bytes():
    """Pinned bytes live in this process right now, or None when pinguard is not loaded."""
    fn = _api("pinguard_live_bytes", ctypes.c_uint64, [])
    return None if fn is None else int(fn())


def peak_bytes():
    """The most pinned bytes live in this process at any moment so far (the report's
    ``totals.peak_live_bytes``), or None when pinguard is not loaded."""
    fn = _api("pinguard_peak_bytes", ctypes.c_uint64, [])
    return None if fn is None else int(fn())


def peak_window_start():
    """Starts a peak window: ``peak_window_bytes()`` then answers the most pinned bytes live since
    this call, while ``peak_bytes()`` keeps the whole process's. Returns False when pinguard is
    not loaded (or is a version without windows)."""
    fn = _api("pinguard_peak_window_start", None, [])
    if fn is None:
        return False
    fn()
    return True


def peak_window_bytes():
    """The most pinned bytes live since the last ``peak_window_start()``, or None when pinguard is
    not loaded (or is a version without windows)."""
    fn = _api("pinguard_peak_window_bytes", ctypes.c_uint64, [])
    return None if fn is None else int(fn())


def write_report(path=None):
    """Writes a report of this process now (reason ``request``) to ``path``, or to
    ``report_path()``; returns the path. Raises RuntimeError when pinguard is not loaded or the
    file cannot be written."""
    fn = _api("pinguard_write_report", ctypes.c_int, [ctypes.c_char_p])
    if fn is None:
        raise RuntimeError("pinguard is not loaded in this process (run it with `pinguard run -- ...`)")
    target = None if path is None else os.fsencode(os.fspath(path))
    if fn(target) != 0:
        raise RuntimeError("pinguard could not write the report%s (see its message on stderr)" % ("" if path is None else " to %s" % os.fspath(path)))
    return os.fspath(path) if path is not None else report_path()


def load_report(path=None):
    """A report as a dict: the file at ``path``, or, without one, a snapshot of this process
    written now. Raises ValueError for a file that is not a pinguard report."""
    if path is None:
        path = write_report()
    with open(path, "rb") as f:
        try:
            report = json.load(f)
        except ValueError as e:
            raise ValueError("%s is not a pinguard report: %s" % (os.fspath(path), e)) from None
    if not isinstance(report, dict) or "totals" not in report:
        raise ValueError("%s is not a pinguard report (no totals)" % os.fspath(path))
    return report
