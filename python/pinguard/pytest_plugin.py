"""pinguard's pytest plugin, in the manner of pytest-memray.

    pytest --pinguard                      # the session runs under pinguard's library
    @pytest.mark.limit_pinned("64 MiB")    # the test's pinned peak must stay at or under this
    @pytest.mark.limit_pinned_leaks("0 B") # ... and what it leaves pinned at its end

A failing test's message names the callsites that pinned, the way ``pinguard report`` does.
Without ``--pinguard`` the markers act only in a process that already runs under pinguard
(``pinguard run -- pytest``); elsewhere they are ignored, as pytest-memray's are without
``--memray``. Registered through the wheel's ``pytest11`` entry point; it does nothing at all
unless asked.
"""

import os
import re
import sys
import tempfile
import time

import pytest

import pinguard

_REEXEC = "PGPYTEST_REEXEC"  # not PINGUARD_*: pinguard reports unknown PINGUARD_ names
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def parse_bytes(text):
    """Bytes from an int or pinguard's forms: ``0``, ``512Ki``, ``64 MiB``, ``1.5GiB``, ``2T``
    (powers of 1024, any case). Raises ValueError with the accepted forms."""
    if isinstance(text, int) and text >= 0:
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)\s*", str(text), re.IGNORECASE)
    if not m or (m.group(3) and m.group(3).lower() not in ("b", "i", "ib")) or (m.group(3).lower().startswith("i") and not m.group(2)):
        raise ValueError("%r is not a size: use bytes or a number with K, M, G, T or P (powers of 1024), e.g. 64MiB" % (text,))
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def human(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return "%.2f %s" % (n / size, unit)
    return "%d B" % n


def pytest_addoption(parser):
    group = parser.getgroup("pinguard", "pinned memory (pinguard)")
    group.addoption("--pinguard", action="store_true", default=False, help="run the test session under pinguard's library, so that the limit_pinned markers act")
    group.addoption("--pinguard-library", default=None, metavar="PATH", help="the preload library (default: the one inside the pinguard package)")


def pytest_configure(config):
    config.addinivalue_line("markers", "limit_pinned(limit): fail the test if its pinned peak exceeds limit (pinguard)")
    config.addinivalue_line("markers", "limit_pinned_leaks(limit): fail the test if it leaves more than limit pinned at its end (pinguard)")
    if not config.getoption("pinguard") or pinguard.active():
        return
    lib = config.getoption("pinguard_library") or pinguard.library_path()
    if os.environ.get(_REEXEC) or not os.path.isfile(lib):
        raise pytest.UsageError("--pinguard: pinguard's library %s %s" % (lib, "did not load (is another preload refusing it?)" if os.environ.get(_REEXEC) else "is not there (give --pinguard-library PATH)"))
    # The library must be in the process from its start: run the same pytest again under it.
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (os.path.abspath(lib), env.get("LD_PRELOAD")) if p)
    env[_REEXEC] = "1"
    args = [sys.executable, "-m", "pytest"] + list(config.invocation_params.args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.chdir(str(config.invocation_params.dir))
    os.execve(sys.executable, args, env)


def _limit(item, name):
    mark = item.get_closest_marker(name)
    if mark is None:
        return None
    value = mark.args[0] if mark.args else mark.kwargs.get("limit")
    try:
        return parse_bytes(value)
    except ValueError as e:
        raise pytest.UsageError("%s: @pytest.mark.%s: %s" % (item.nodeid, name, e)) from None


def _snapshot(where):
    path = os.path.join(where, "%d.json" % time.monotonic_ns())
    return pinguard.load_report(pinguard.write_report(path))


def _key(site):
    return site.get("id")


def _name(site):
    """The innermost Python frames (three at most) and the entry point, else the first native
    frame that has a name: ``pin (test_model.py:7) <- load_weights (test_model.py:12) ->
    cudaHostAlloc``."""
    api = "/".join(site.get("apis", [])) or "?"
    py = ["%s (%s:%s)" % (f.get("symbol", "?"), os.path.basename(f.get("file") or f.get("module") or "?"), f.get("line", "?")) for f in site.get("py_frames", [])[:3]]
    if py:
        return "%s -> %s" % (" <- ".join(py), api)
    for f in site.get("frames", [])[1:]:
        if f.get("symbol"):
            return "%s -> %s" % (f["symbol"], api)
    return api


def _grown(before, after, field):
    """Callsites whose ``field`` grew between two snapshots, most first: (growth, site)."""
    old = {}
    for s in before.get("callsites", []):
        old[_key(s)] = old.get(_key(s), 0) + s.get(field, 0)
    out = []
    for s in after.get("callsites", []):
        d = s.get(field, 0) - old.pop(_key(s), 0)
        if d > 0:
            out.append((d, s))
    return sorted(out, key=lambda x: -x[0])


def _lines(grown, n=3):
    return "".join("\n    %s  %s" % (human(d), _name(s)) for d, s in grown[:n])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    peak_limit, leak_limit = _limit(item, "limit_pinned"), _limit(item, "limit_pinned_leaks")
    if (peak_limit is None and leak_limit is None) or not pinguard.active():
        yield
        return
    with tempfile.TemporaryDirectory(prefix="pinguard-pytest-") as where:
        before = _snapshot(where)
        pinguard.peak_window_start()
        outcome = yield
        window = pinguard.peak_window_bytes()
        after = _snapshot(where)
    if outcome.excinfo is not None:
        return
    problems = []
    if leak_limit is not None:
        left = after["totals"]["live_bytes"] - before["totals"]["live_bytes"]
        if left > leak_limit:
            problems.append("left %s pinned at its end, over the limit of %s (limit_pinned_leaks); still pinned from:%s" % (human(left), human(leak_limit), _lines(_grown(before, after, "live_bytes"))))
    if peak_limit is not None:
        if window is None:
            pytest.fail("pinguard: this library has no peak window (pinguard_peak_window_bytes): limit_pinned needs pinguard 0.1.0 of issue 46 or later", pytrace=False)
        # The test's own: what was live when it started does not count against it.
        peak = max(window - before["totals"]["live_bytes"], 0)
        if peak > peak_limit:
            problems.append("pinned a peak of %s, over the limit of %s (limit_pinned); pinned by:%s" % (human(peak), human(peak_limit), _lines(_grown(before, after, "alloc_bytes"))))
    if problems:
        pytest.fail("pinguard: test %s" % "; and ".join(problems), pytrace=False)
