"""Pins through ctypes with the GIL released (ctypes releases it around every foreign call), from
named functions, two threads, a deep recursion and a native thread, for tests/python_frames.rs.
The lines marked `# at:NAME` are where each pinning call is; the test finds them by the marker.
    python py_frames.py LIBCUDART LIBFRAMEWORK"""
import ctypes
import sys
import threading

rt = ctypes.CDLL(sys.argv[1])  # ctypes.CDLL(path).fn: found with dlsym(handle)
fw = ctypes.CDLL(sys.argv[2])  # a native library that links the runtime
fw.framework_pin.restype = ctypes.c_void_p
fw.framework_pin.argtypes = [ctypes.c_size_t]
fw.framework_pin_in_native_thread.restype = ctypes.c_void_p
fw.framework_pin_in_native_thread.argtypes = [ctypes.c_size_t]
libc = ctypes.CDLL(None)  # the global scope: libc's mlock
libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
kept = []


def load_weights():
    p = ctypes.c_void_p()
    assert rt.cudaHostAlloc(ctypes.byref(p), ctypes.c_size_t(1 << 20), ctypes.c_uint(0)) == 0  # at:load_weights
    kept.append(p)


def lock_key():
    buf = ctypes.create_string_buffer(4096 * 2)
    page = (ctypes.addressof(buf) + 4095) & ~4095
    assert libc.mlock(ctypes.c_void_p(page), 4096) == 0  # at:lock_key
    kept.append(buf)


def pin_batch():
    kept.append(fw.framework_pin(65536))  # at:pin_batch


def loader_thread():
    for _ in range(4):
        pin_batch()


def recurse(n):
    if n == 0:
        kept.append(fw.framework_pin(12288))  # at:recurse
        return
    recurse(n - 1)


load_weights()  # at:call:load_weights
lock_key()  # at:call:lock_key
threads = [threading.Thread(target=loader_thread) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
recurse(100)
kept.append(fw.framework_pin_in_native_thread(20480))
print("done")
