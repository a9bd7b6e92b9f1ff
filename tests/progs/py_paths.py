"""One helper that pins, reached from three callers (a loader, a cache, a warm-up), and a fourth
caller whose call the budget refuses, which the program sees as an out-of-memory error; for the
Python callsite tests (tests/python_frames.rs, cli/tests/python_paths.rs). The lines marked
`# at:NAME` are where each call is; the tests find them by the marker.
    python py_paths.py LIBCUDART [CACHE_ENTRIES]   (2 cache entries unless told)"""
import ctypes
import sys

rt = ctypes.CDLL(sys.argv[1])  # ctypes.CDLL(path).fn: found with dlsym(handle)
kept = []
cache_entries = int(sys.argv[2]) if len(sys.argv) > 2 else 2


def cuda_pin(size):
    p = ctypes.c_void_p()
    rc = rt.cudaHostAlloc(ctypes.byref(p), ctypes.c_size_t(size), ctypes.c_uint(0))  # at:cuda_pin
    if rc != 0:
        raise MemoryError("cudaHostAlloc of %d bytes: error %d" % (size, rc))
    kept.append(p)


def load_weights():
    cuda_pin(1 << 20)  # at:load_weights


def fill_cache():
    for _ in range(cache_entries):
        try:
            cuda_pin(256 << 10)  # at:fill_cache
        except MemoryError:
            print("cache full")  # a cache fills until memory runs out
            return


def warm_up():
    cuda_pin(64 << 10)  # at:warm_up


def grow_cache():
    cuda_pin(64 << 20)  # at:grow_cache


load_weights()
fill_cache()
for step in (warm_up, grow_cache):
    try:
        step()
    except MemoryError as e:
        print("refused:", e)
print("done")
