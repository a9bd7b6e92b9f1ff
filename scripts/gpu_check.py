#!/usr/bin/env python3
"""pinguard against a real GPU runtime: PyTorch's DataLoader(pin_memory=True) and friends.

Run by scripts/gpu-check.sh. Each check starts a child Python process with the library preloaded
and compares what pinguard reports with what the framework says of itself. One line per check,
PASS/FAIL/SKIP with the figures; exit status 1 if any check fails.

Backends:
  torch  the real thing: PyTorch's CachingHostAllocator over NVIDIA's runtime and driver.
  --hip  an AMD device: PyTorch for ROCm (the same DataLoader checks over libamdhip64), and the HIP
         runtime's own entry points through ctypes (check 8); with emul, check 8 alone against the
         emulated libamdhip64.so.5.
  emul   --dry-run: the same checks on the CPU, against the emulated runtime of tests/emul (real
         mmap + mlock). A small caching host allocator written here stands in for PyTorch's: it
         pins through libframework.so (a C library linking the runtime, as libtorch does), rounds
         blocks to powers of two, caches freed blocks, keeps torch's host_memory_stats() figures,
         and checks pinning with cudaHostGetFlags; producer threads stand in for the workers.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

BATCHES = 300
BATCH_BYTES = 3 * 64 * 64 * 4 * 64  # 64 samples of 3x64x64 float32: 3 MiB a batch


# ---------------------------------------------------------------------------------------------
# The children: one loop each, reporting one RESULT line.

def child_torch(mode):
    import torch
    from torch.utils.data import DataLoader, Dataset

    if mode == "cupy":
        import cupy
        mem = cupy.cuda.alloc_pinned_memory(64 << 20)
        return {"held": 64 << 20, "ptr": int(mem.ptr)}
    if mode == "jax":
        import jax
        import numpy as np
        dev = jax.devices()[0]
        x = jax.device_put(np.ones((16 << 20) // 4, dtype=np.float32), jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host"))
        x.block_until_ready()
        return {"held": 16 << 20, "kind": str(x.sharding.memory_kind)}

    class Synthetic(Dataset):
        def __len__(self):
            return BATCHES * 64

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return torch.randn(3, 64, 64, generator=g)

    loader = DataLoader(Synthetic(), batch_size=64, pin_memory=True, num_workers=2)
    total = torch.zeros((), device="cuda", dtype=torch.float64)
    unpinned = batches = 0
    start = time.perf_counter()
    for x in loader:
        batches += 1
        if not x.is_pinned():
            unpinned += 1
        total += x.to("cuda", non_blocking=True).double().sum()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    stats = {k: int(v) for k, v in torch.cuda.host_memory_stats().items() if isinstance(v, (int, float))}
    return {"batches": batches, "unpinned": unpinned, "checksum": round(float(total.item()), 3), "seconds": elapsed, "stats": stats}


def child_emul(mode, emul_dir):
    import ctypes
    import queue
    import threading
    import zlib

    fw = ctypes.CDLL(os.path.join(emul_dir, "libframework.so"))  # RTLD_LOCAL, like an extension module
    fw.framework_pin.restype = ctypes.c_void_p
    fw.framework_pin.argtypes = [ctypes.c_size_t]
    fw.framework_unpin.argtypes = [ctypes.c_void_p]
    rt = ctypes.CDLL(os.path.join(emul_dir, "libcudart.so"))
    rt.cudaHostGetFlags.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.c_void_p]
    rt.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    rt.cudaHostUnregister.argtypes = [ctypes.c_void_p]
    libc = ctypes.CDLL(None)
    libc.aligned_alloc.restype = ctypes.c_void_p
    libc.aligned_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    register = "pinned_use_cuda_host_register:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")

    class HostAllocator:
        """PyTorch's CachingHostAllocator in miniature: power-of-two blocks, a free cache."""

        def __init__(self):
            self.lock = threading.Lock()
            self.free = {}
            self.stats = {"allocated_bytes.current": 0, "allocated_bytes.peak": 0, "allocations.current": 0, "num_host_alloc": 0}

        def allocate(self, n):
            size = 1 << (n - 1).bit_length()
            with self.lock:
                if self.free.get(size):
                    return self.free[size].pop(), size
            if register:
                p = libc.aligned_alloc(4096, size)
                if p and rt.cudaHostRegister(p, size, 0) != 0:
                    libc.free(p)
                    p = None
            else:
                p = fw.framework_pin(size)
            if not p:
                raise RuntimeError("CUDA error: out of memory (pinning %d bytes)" % size)
            with self.lock:
                s = self.stats
                s["allocated_bytes.current"] += size
                s["allocated_bytes.peak"] = max(s["allocated_bytes.peak"], s["allocated_bytes.current"])
                s["allocations.current"] += 1
                s["num_host_alloc"] += 1
            return p, size

        def release(self, block):
            with self.lock:
                self.free.setdefault(block[1], []).append(block[0])

    alloc = HostAllocator()
    work, pinned = queue.Queue(maxsize=4), queue.Queue(maxsize=4)
    failure = []

    def producer(k):  # a DataLoader worker
        for b in range(k, BATCHES, 2):
            data = bytes((b * 7 + i) & 0xFF for i in range(256)) * (BATCH_BYTES // 256)
            work.put((b, data))
        work.put(None)

    def pin_thread():  # torch/utils/data/_utils/pin_memory.py
        done = 0
        try:
            while done < 2:
                item = work.get()
                if item is None:
                    done += 1
                    continue
                block = alloc.allocate(len(item[1]))
                ctypes.memmove(block[0], item[1], len(item[1]))
                pinned.put((item[0], block, len(item[1])))
        except Exception as e:  # re-raised in the main thread, as the DataLoader does
            failure.append(e)
            while True:  # let the producers finish
                item = work.get()
                if item is None:
                    done += 1
                    if done == 2:
                        break
        pinned.put(None)

    threads = [threading.Thread(target=producer, args=(k,)) for k in (0, 1)] + [threading.Thread(target=pin_thread)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    checksum = batches = unpinned = 0
    flags = ctypes.c_uint()
    while True:
        item = pinned.get()
        if item is None:
            break
        b, block, n = item
        batches += 1
        if rt.cudaHostGetFlags(ctypes.byref(flags), block[0]) != 0:
            unpinned += 1
        checksum = (checksum + zlib.crc32(ctypes.string_at(block[0], n)) * (b + 1)) % (1 << 61)  # "the copy to the GPU"
        alloc.release(block)
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if failure:
        raise failure[0]
    return {"batches": batches, "unpinned": unpinned, "checksum": checksum, "seconds": elapsed, "stats": dict(alloc.stats)}


def child_driver(emul_dir):
    """Check 7: host memory through the driver's newer paths, cuMemCreate at a host NUMA location
    and a host memory pool, with pinguard's live figure read before, during and after each."""
    import ctypes
    c = ctypes.c_uint64
    cu = ctypes.CDLL(os.path.join(emul_dir, "libcuda.so.1") if emul_dir else "libcuda.so.1")
    live = ctypes.CDLL(None).pinguard_live_bytes
    live.restype = c
    out = {}
    if cu.cuInit(0) != 0:
        raise RuntimeError("cuInit failed")
    ver = ctypes.c_int(0)
    cu.cuDriverGetVersion(ctypes.byref(ver))
    out["driver_version"] = ver.value
    if hasattr(cu, "cuDevicePrimaryCtxRetain"):  # a real driver: a context for the device
        dev, ctx = ctypes.c_int(0), ctypes.c_void_p()
        if cu.cuDeviceGet(ctypes.byref(dev), 0) != 0 or cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) != 0 or cu.cuCtxSetCurrent(ctx) != 0:
            raise RuntimeError("no CUDA context")
    for loc_type in (3, 2):  # CU_MEM_LOCATION_TYPE_HOST_NUMA (node 0), then HOST
        prop = (ctypes.c_int * 8)(1, 0, loc_type, 0, 0, 0, 0, 0)  # PINNED, no handle types, location, rest 0
        size = c(2 << 20)
        if hasattr(cu, "cuMemGetAllocationGranularity"):
            g = ctypes.c_size_t(0)
            if cu.cuMemGetAllocationGranularity(ctypes.byref(g), prop, 0) == 0 and g.value:
                size = c(g.value)
        h = c(0)
        before = live()
        rc = cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size.value), prop, c(0))
        if rc != 0:
            out["vmm_rc_%d" % loc_type] = rc
            continue
        during = live()
        cu.cuMemRelease(h)
        out.update(vmm_location=loc_type, vmm_size=size.value, vmm_added=during - before, vmm_left=live() - before)
        break
    for loc_type in (3, 2):
        props = (ctypes.c_int * 22)(1, 0, loc_type, 0)  # CUmemPoolProps: allocType, handleTypes, location, the rest 0
        pool, d = ctypes.c_void_p(), c(0)
        before = live()
        rc = cu.cuMemPoolCreate(ctypes.byref(pool), props)
        if rc != 0:
            out["pool_rc_%d" % loc_type] = rc
            continue
        rc = cu.cuMemAllocFromPoolAsync(ctypes.byref(d), ctypes.c_size_t(1 << 20), pool, None)
        if rc != 0:
            out["pool_alloc_rc_%d" % loc_type] = rc
            cu.cuMemPoolDestroy(pool)
            continue
        if hasattr(cu, "cuStreamSynchronize"):
            cu.cuStreamSynchronize(None)
        reserved = c(0)
        cu.cuMemPoolGetAttribute(pool, 5, ctypes.byref(reserved))  # RESERVED_MEM_CURRENT
        during = live()
        cu.cuMemFreeAsync(d, None)
        if hasattr(cu, "cuStreamSynchronize"):
            cu.cuStreamSynchronize(None)
        cu.cuMemPoolTrimTo(pool, ctypes.c_size_t(0))
        cu.cuMemPoolDestroy(pool)
        out.update(pool_location=loc_type, pool_reserved=reserved.value, pool_added=during - before, pool_left=live() - before)
        break
    return out


def child_devmem(emul_dir):
    """Check 10: memory that is not RAM, and device memory, through the driver: an I/O-memory
    registration (CU_MEMHOSTREGISTER_IOMEMORY) of 64 KiB of fresh pages, and a 4 MiB cuMemAlloc_v2,
    with pinguard's live figure read around each and the device's own word on whether it is
    integrated (CU_DEVICE_ATTRIBUTE_INTEGRATED)."""
    import ctypes
    import mmap
    c = ctypes.c_uint64
    cu = ctypes.CDLL(os.path.join(emul_dir, "libcuda.so.1") if emul_dir else "libcuda.so.1")
    try:
        live = ctypes.CDLL(None).pinguard_live_bytes
        live.restype = c
    except AttributeError:  # the run without pinguard
        live = lambda: 0
    if cu.cuInit(0) != 0:
        raise RuntimeError("cuInit failed")
    dev = ctypes.c_int(0)
    if hasattr(cu, "cuDevicePrimaryCtxRetain"):  # a real driver: a context for the device
        ctx = ctypes.c_void_p()
        if cu.cuDeviceGet(ctypes.byref(dev), 0) != 0 or cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) != 0 or cu.cuCtxSetCurrent(ctx) != 0:
            raise RuntimeError("no CUDA context")
    integrated = ctypes.c_int(-1)
    cu.cuDeviceGetAttribute(ctypes.byref(integrated), 18, dev)
    pages = mmap.mmap(-1, 64 << 10)
    addr = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(pages)))
    before = live()
    rc_io = cu.cuMemHostRegister_v2(addr, ctypes.c_size_t(64 << 10), ctypes.c_uint(4))
    io_added = live() - before
    if rc_io == 0:
        cu.cuMemHostUnregister(addr)
    d = c(0)
    before = live()
    rc_alloc = cu.cuMemAlloc_v2(ctypes.byref(d), ctypes.c_size_t(4 << 20))
    alloc_added = live() - before
    if rc_alloc == 0:
        cu.cuMemFree_v2(d)
    return {"integrated": integrated.value, "rc_io": rc_io, "io_added": io_added, "rc_alloc": rc_alloc,
            "alloc_added": alloc_added, "alloc_left": live() - before}


def child_hip(emul_dir):
    """Check 8: the HIP runtime's host memory, through dlsym(handle) (ctypes) and, where the
    runtime has it, hipGetProcAddress, with pinguard's live figure read before, during and after:
    hipHostMalloc, hipExtHostAlloc, hipHostRegister, and a host pool where the runtime takes host
    locations (ROCm 6.x)."""
    import ctypes
    hip = ctypes.CDLL(os.path.join(emul_dir, "libamdhip64.so.5") if emul_dir else "libamdhip64.so")
    live = ctypes.CDLL(None).pinguard_live_bytes
    live.restype = ctypes.c_uint64
    size = 4 << 20
    out = {}
    ver = ctypes.c_int(0)
    if hasattr(hip, "hipRuntimeGetVersion"):
        hip.hipRuntimeGetVersion(ctypes.byref(ver))
    out["runtime_version"] = ver.value
    p = ctypes.c_void_p()

    def measure(name, alloc, free):
        before = live()
        rc = alloc()
        if rc != 0:
            out[name + "_rc"] = rc
            return
        during = live()
        free()
        out[name] = [during - before, live() - before]

    measure("hipHostMalloc", lambda: hip.hipHostMalloc(ctypes.byref(p), ctypes.c_size_t(size), 0), lambda: hip.hipHostFree(p))
    if hasattr(hip, "hipExtHostAlloc"):
        measure("hipExtHostAlloc", lambda: hip.hipExtHostAlloc(ctypes.byref(p), ctypes.c_size_t(size), 0), lambda: hip.hipFreeHost(p))
    buf = ctypes.create_string_buffer(size)
    measure("hipHostRegister", lambda: hip.hipHostRegister(buf, ctypes.c_size_t(size), 0), lambda: hip.hipHostUnregister(buf))
    if hasattr(hip, "hipGetProcAddress"):
        fn, status = ctypes.c_void_p(), ctypes.c_int(0)
        rc = hip.hipGetProcAddress(b"hipHostMalloc", ctypes.byref(fn), 603, ctypes.c_uint64(0), ctypes.byref(status))
        if rc == 0 and fn.value:
            f = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint)(fn.value)
            measure("hipGetProcAddress", lambda: f(ctypes.byref(p), size, 0), lambda: hip.hipHostFree(p))
        else:
            out["hipGetProcAddress_rc"] = rc
    props = (ctypes.c_int * 22)(1, 0, 2, 0)  # hipMemPoolProps: pinned, no handle types, {host, 0}
    pool, d = ctypes.c_void_p(), ctypes.c_void_p()
    before = live()
    rc = hip.hipMemPoolCreate(ctypes.byref(pool), props)
    if rc == 0:
        rc = hip.hipMallocFromPoolAsync(ctypes.byref(d), ctypes.c_size_t(1 << 20), pool, None)
        reserved = ctypes.c_uint64(0)
        hip.hipMemPoolGetAttribute(pool, 5, ctypes.byref(reserved))  # hipMemPoolAttrReservedMemCurrent
        during = live()
        if rc == 0:
            hip.hipFreeAsync(d, None)
        if hasattr(hip, "hipStreamSynchronize"):
            hip.hipStreamSynchronize(None)
        hip.hipMemPoolTrimTo(pool, ctypes.c_size_t(0))
        hip.hipMemPoolDestroy(pool)
        out["pool"] = [reserved.value, during - before, live() - before]
    else:
        out["pool_rc"] = rc
    out["size"] = size
    return out


COUNTERS = ("VmLck", "VmPin", "RssShmem")
COUNTER_BYTES = 16 << 20


def status_counters():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in COUNTERS:
                out[key] = int(value.split()[0]) * 1024
    return out


def child_counters(emul_dir):
    """Which of the process's own counters each host-pinning path moves (VmLck: mlock's, checked
    against RLIMIT_MEMLOCK; VmPin: long-term pins, checked against it too; RssShmem: shared
    mappings), measured while 16 MiB are held, and pinguard's kernel-pinned bytes at that moment
    (a report written then): a path that moves VmPin must not show there, or it is counted twice."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    if emul_dir:
        rt = ctypes.CDLL(os.path.join(emul_dir, "libcudart.so"))
    else:
        import torch
        torch.cuda.init()
        rt = ctypes.CDLL("libcudart.so.%s" % torch.version.cuda.split(".")[0])
    rt.cudaHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
    rt.cudaFreeHost.argtypes = [ctypes.c_void_p]
    rt.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    rt.cudaHostUnregister.argtypes = [ctypes.c_void_p]
    n = COUNTER_BYTES

    def alloc():
        p = ctypes.c_void_p()
        rc = rt.cudaHostAlloc(ctypes.byref(p), n, 0)
        return rc, (lambda: rt.cudaFreeHost(p))

    def register():
        m = libc.mmap(None, n, 3, 0x22, -1, 0)  # PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS
        rc = rt.cudaHostRegister(m, n, 0)
        return rc, (lambda: (rt.cudaHostUnregister(m), libc.munmap(m, n)))

    try:
        write = ctypes.CDLL(None).pinguard_write_report
        write.argtypes = [ctypes.c_char_p]
    except AttributeError:
        write = None
    out = {}
    for name, pin in (("cudaHostAlloc", alloc), ("cudaHostRegister", register)):
        before = status_counters()
        rc, release = pin()
        during = status_counters()
        kernel_pinned = None
        if write and rc == 0:
            path = os.path.join(os.environ.get("GPU_CHECK_DIR", "/tmp"), "held.%s.json" % name)
            if write(path.encode()) == 0:
                kernel_pinned = json.load(open(path))["totals"].get("kernel_pinned_bytes")
        release()
        out[name] = {"rc": rc, "moved": {k: during.get(k, 0) - before.get(k, 0) for k in COUNTERS},
                     "kernel_pinned": kernel_pinned}
    return out


def child_card(emul_dir):
    """A range cudaHostRegister pinned, then registered with the RDMA card (as LMCache and
    SGLang's HiCache register pools the runtime pinned): counted once while both hold it, nothing
    of it kernel-pinned again, and gone when both have let go. Needs a card: without one the
    result says so (skipped); the dry run uses the emulated libibverbs."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    if emul_dir:
        rt = ctypes.CDLL(os.path.join(emul_dir, "libcudart.so"))
        ib = ctypes.CDLL(os.path.join(emul_dir, "libibverbs.so.1"), use_errno=True)
        context = None
    else:
        import torch
        torch.cuda.init()
        rt = ctypes.CDLL("libcudart.so.%s" % torch.version.cuda.split(".")[0])
        try:
            ib = ctypes.CDLL("libibverbs.so.1", use_errno=True)
        except OSError as e:
            return {"skip": "no libibverbs.so.1 (%s)" % e}
        ib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
        ib.ibv_get_device_list.argtypes = [ctypes.POINTER(ctypes.c_int)]
        ib.ibv_open_device.restype = ctypes.c_void_p
        ib.ibv_open_device.argtypes = [ctypes.c_void_p]
        n = ctypes.c_int(0)
        devices = ib.ibv_get_device_list(ctypes.byref(n))
        if not devices or n.value == 0:
            return {"skip": "no RDMA device"}
        context = ib.ibv_open_device(devices[0])
        if not context:
            return {"skip": "ibv_open_device failed (errno %d)" % ctypes.get_errno()}
    ib.ibv_alloc_pd.restype = ctypes.c_void_p
    ib.ibv_alloc_pd.argtypes = [ctypes.c_void_p]
    ib.ibv_reg_mr.restype = ctypes.c_void_p
    ib.ibv_reg_mr.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    ib.ibv_dereg_mr.argtypes = [ctypes.c_void_p]
    rt.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    rt.cudaHostUnregister.argtypes = [ctypes.c_void_p]
    write = ctypes.CDLL(None).pinguard_write_report
    write.argtypes = [ctypes.c_char_p]
    n = COUNTER_BYTES
    pd = ib.ibv_alloc_pd(context)
    if not pd:
        return {"skip": "ibv_alloc_pd failed (errno %d)" % ctypes.get_errno()}
    m = libc.mmap(None, n, 3, 0x22, -1, 0)
    out = {"register_rc": rt.cudaHostRegister(m, n, 0)}
    mr = ib.ibv_reg_mr(pd, m, n, 1)  # IBV_ACCESS_LOCAL_WRITE
    out["reg_mr"] = bool(mr)

    def totals(tag):
        path = os.path.join(os.environ.get("GPU_CHECK_DIR", "/tmp"), "card.%s.json" % tag)
        write(path.encode())
        return json.load(open(path))["totals"]
    held = totals("held")
    out["held_live"], out["held_kernel_pinned"] = held["live_bytes"], held.get("kernel_pinned_bytes")
    if mr:
        ib.ibv_dereg_mr(mr)
    rt.cudaHostUnregister(m)
    out["after_live"] = totals("after")["live_bytes"]
    return out


def child(args):
    snapshot = os.environ.get("GPU_CHECK_SNAPSHOT")
    try:
        if args.child == "counters":
            out = child_counters(args.emul_dir if args.backend == "emul" else "")
        elif args.child == "driver":
            out = child_driver(args.emul_dir if args.backend == "emul" else "")
        elif args.child == "hip":
            out = child_hip(args.emul_dir if args.backend == "emul" else "")
        elif args.child == "card":
            out = child_card(args.emul_dir if args.backend == "emul" else "")
        elif args.child == "devmem":
            out = child_devmem(args.emul_dir if args.backend == "emul" else "")
        else:
            out = child_torch(args.child) if args.backend == "torch" else child_emul(args.child, args.emul_dir)
        out["ok"] = True
    except Exception as e:
        out = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
    if snapshot:  # pinguard's figures at the same moment as the framework's
        import ctypes
        try:
            write = ctypes.CDLL(None).pinguard_write_report
            write.argtypes = [ctypes.c_char_p]
            out["snapshot_rc"] = write(snapshot.encode())
        except AttributeError:
            out["snapshot_rc"] = "pinguard not loaded"
    print("RESULT " + json.dumps(out), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# The checks.

class Checks:
    def __init__(self, args):
        self.args = args
        self.failed = 0
        self.tmp = tempfile.mkdtemp(prefix="gpu-check-")

    def line(self, status, name, detail):
        print("%s %s: %s" % (status, name, detail), flush=True)
        if status == "FAIL":
            self.failed += 1

    def check(self, name, ok, detail):
        self.line("PASS" if ok else "FAIL", name, detail)

    def run(self, tag, mode="loader", preload=True, env=None):
        """Runs one child; returns (result, exit report, snapshot, stderr tail)."""
        d = os.path.join(self.tmp, tag)
        os.makedirs(d, exist_ok=True)
        e = {k: v for k, v in os.environ.items() if not k.startswith("PINGUARD_")}
        e.pop("LD_PRELOAD", None)
        if preload:
            e.update({"LD_PRELOAD": self.args.lib, "PINGUARD_REPORT": os.path.join(d, "exit.%p.json"), "PINGUARD_DEPTH": "32",
                      "GPU_CHECK_SNAPSHOT": os.path.join(d, "snapshot.json")})
        e.update(env or {})
        e["GPU_CHECK_DIR"] = d
        cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--backend", self.args.backend, "--emul-dir", self.args.emul_dir]
        try:
            p = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=self.args.timeout)
            out, err, rc = p.stdout, p.stderr, p.returncode
        except subprocess.TimeoutExpired as t:
            out, err, rc = t.stdout or "", "timed out after %ss" % self.args.timeout, -9
        result = next((json.loads(l[7:]) for l in out.splitlines() if l.startswith("RESULT ")), None)
        if result is None:
            result = {"ok": False, "error": "no result (exit %s)" % rc}
        result["exit"] = rc
        reports = sorted(glob.glob(os.path.join(d, "exit.*.json")))
        load = lambda p: json.load(open(p)) if p and os.path.exists(p) else None
        return result, load(reports[-1] if reports else None), load(os.path.join(d, "snapshot.json")), "\n".join(err.strip().splitlines()[-3:])

    def pinned_of(self, stats):
        """torch's figure for pinned bytes held (active + cached): allocated_bytes since 2.7,
        reserved_bytes (segments from cudaHostAlloc) before."""
        for key in ("reserved_bytes", "allocated_bytes"):
            if key + ".current" in stats:
                return key, stats[key + ".current"], stats.get(key + ".peak")
        return None, None, None

    def top_names(self, report):
        cs = (report or {}).get("callsites") or []
        if not cs:
            return []
        return [f.get("symbol") or "?" for f in cs[0].get("frames", [])]

    def hip(self):
        """Check 8: each HIP entry point counted while held and gone after its release."""
        r, rep, snap, err = self.run("hip", mode="hip")
        if not r["ok"]:
            self.check("8 HIP host memory", False, "%s %s" % (r.get("error"), err))
            return
        size = r["size"]
        for name in ("hipHostMalloc", "hipExtHostAlloc", "hipHostRegister", "hipGetProcAddress"):
            if name in r:
                added, left = r[name]
                self.check("8 %s tracked" % name, added == size and left == 0, "%d bytes held, %d counted, %d left after release" % (size, added, left))
            else:
                self.line("SKIP", "8 %s" % name, "the runtime (version %d) answered %s" % (r["runtime_version"], r.get(name + "_rc", "that it has no such function")))
        if "pool" in r:
            reserved, added, left = r["pool"]
            self.check("8 HIP host pool tracked", added == reserved and left == 0, "%d bytes reserved, %d counted, %d left after trim and destroy" % (reserved, added, left))
        else:
            self.line("SKIP", "8 HIP host pool", "hipMemPoolCreate at a host location answered %s (5.x has no host location)" % r.get("pool_rc"))

    def devmem(self):
        """Check 10: under `error` with a zero budget, an I/O-memory registration gets the driver's own
        answer (as without pinguard) and counts nothing; a device allocation is refused where the
        device says it is integrated (its memory the host's) and untouched where it is discrete."""
        base = self.run("devmem-without", mode="devmem", preload=False)[0]
        r, rep, snap, err = self.run("devmem", mode="devmem", env={"PINGUARD_BUDGET": "0", "PINGUARD_POLICY": "error"})
        if not base["ok"] or not r["ok"]:
            self.check("10 I/O memory and device memory", False, "%s / %s %s" % (base.get("error"), r.get("error"), err))
            return
        listed = ((snap or {}).get("apis") or {}).get("cuMemHostRegister(IOMEMORY)", {}).get("alloc_count", 0)
        self.check("10 IoMemory registration passes through", r["rc_io"] == base["rc_io"] and r["io_added"] == 0 and (r["rc_io"] != 0 or listed == 1),
                   "driver's answer %d (without pinguard %d), %d bytes counted, listed %d time(s)" % (r["rc_io"], base["rc_io"], r["io_added"], listed))
        if r["integrated"] == 1:
            self.check("10 integrated device: cuMemAlloc_v2 counted as host bytes", r["rc_alloc"] == 2 and base["rc_alloc"] == 0,
                       "refused at a zero budget: %d (without pinguard %d)" % (r["rc_alloc"], base["rc_alloc"]))
        else:
            self.check("10 discrete device: cuMemAlloc_v2 untouched", r["rc_alloc"] == base["rc_alloc"] and r["alloc_added"] == 0,
                       "integrated=%d, answer %d (without pinguard %d), %d bytes counted" % (r["integrated"], r["rc_alloc"], base["rc_alloc"], r["alloc_added"]))

    def all(self):
        a = self.args
        if a.hip and a.backend == "emul":
            print("# gpu-check: HIP, dry run against the emulated libamdhip64.so.5, library %s" % a.lib, flush=True)
            self.hip()
            print("# gpu-check: %s" % ("all checks passed" if not self.failed else "%d check(s) failed" % self.failed), flush=True)
            return 1 if self.failed else 0
        allocator = "CachingHostAllocator" if a.backend == "torch" else "framework_pin"
        print("# gpu-check: backend %s%s, library %s" % (a.backend, " (dry run, emulated runtime)" if a.backend == "emul" else "", a.lib), flush=True)

        # 1. Unconstrained: pinguard's figures against the framework's own.
        r, rep, snap, err = self.run("plain")
        if not r["ok"] or not snap:
            self.check("1 DataLoader(pin_memory=True, num_workers=2)", False, "%s %s" % (r.get("error"), err))
        else:
            key, cur, peak = self.pinned_of(r["stats"])
            t = snap["totals"]
            self.check("1 live pinned bytes agree", key is not None and t["live_bytes"] == cur,
                       "pinguard %d, framework %s.current %s (%d batches)" % (t["live_bytes"], key, cur, r["batches"]))
            self.check("1 peak pinned bytes agree", key is not None and t["peak_live_bytes"] == peak,
                       "pinguard %d, framework %s.peak %s" % (t["peak_live_bytes"], key, peak))
            names = self.top_names(snap)
            self.check("1 top callsite names the host allocator", any(allocator in n for n in names[:8]),
                       "first frames: %s" % ", ".join(names[:4]))
        base = r

        # 2. A budget below the loader's need, policy error: an exception in Python, no crash.
        budget = 2 << 20
        r, rep, snap, err = self.run("error", env={"PINGUARD_BUDGET": str(budget), "PINGUARD_POLICY": "error"})
        denied = (rep or {}).get("totals", {}).get("denied_count", 0)
        self.check("2 error policy: Python gets an exception", not r["ok"] and r["exit"] == 0 and bool(r.get("error")),
                   "exit %s, %s" % (r["exit"], r.get("error", "no exception")[:120]))
        self.check("2 error policy: the report records the refusals", denied > 0, "denied_count %d under a %d-byte budget" % (denied, budget))

        # 3. The same budget with downgrade: the loop completes, results unchanged, budget held.
        budget = 8 << 20
        r, rep, snap, err = self.run("downgrade", env={"PINGUARD_BUDGET": str(budget), "PINGUARD_POLICY": "downgrade"})
        if not r["ok"] or not rep:
            self.check("3 downgrade policy", False, "%s %s" % (r.get("error"), err))
        else:
            t = rep["totals"]
            self.check("3 downgrade: the loop completes", r["batches"] == BATCHES, "%d of %d batches" % (r["batches"], BATCHES))
            self.check("3 downgrade: downgraded batches are not pinned", r["unpinned"] > 0 and t["downgraded_count"] > 0,
                       "%d batches with is_pinned() False, %d downgraded calls" % (r["unpinned"], t["downgraded_count"]))
            self.check("3 downgrade: results equal the unconstrained run's", base.get("ok") and r["checksum"] == base.get("checksum"),
                       "checksum %s vs %s" % (r["checksum"], base.get("checksum")))
            self.check("3 downgrade: pinned bytes never above the budget", t["peak_live_bytes"] <= budget,
                       "peak %d of %d" % (t["peak_live_bytes"], budget))

        # 4. The cudaHostRegister path of PyTorch's allocator (hipHostRegister on ROCm).
        register = "hipHostRegister" if a.hip else "cudaHostRegister"
        r, rep, snap, err = self.run("register", env={"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:True"})
        reg = ((snap or {}).get("apis") or {}).get(register, {})
        key, cur, _ = self.pinned_of(r.get("stats", {}))
        self.check("4 pinned_use_cuda_host_register: tracked", r["ok"] and reg.get("alloc_count", 0) > 0 and reg.get("live_bytes") == cur,
                   "%s: %s calls, %s bytes live; framework %s" % (register, reg.get("alloc_count", 0), reg.get("live_bytes"), cur) if r["ok"] else "%s %s" % (r.get("error"), err))

        # 5. CuPy's pinned pool and a JAX array in pinned host memory (the driver path).
        for mod in ("cupy", "jax"):
            if a.hip:
                self.line("SKIP", "5 %s" % mod, "CUDA only here")
                continue
            if a.backend != "torch":
                self.line("SKIP", "5 %s" % mod, "dry run: needs the real runtime")
                continue
            if subprocess.run([sys.executable, "-c", "import " + mod], capture_output=True).returncode != 0:
                self.line("SKIP", "5 %s" % mod, "not installed")
                continue
            r, rep, snap, err = self.run(mod, mode=mod)
            live = (snap or {}).get("totals", {}).get("live_bytes", 0)
            apis = sorted(k for k, v in ((snap or {}).get("apis") or {}).items() if v.get("live_bytes"))
            self.check("5 %s pinned memory tracked" % mod, r["ok"] and live >= r.get("held", 1 << 62),
                       "%d bytes live through %s (held %s)" % (live, ", ".join(apis) or "nothing", r.get("held")) if r["ok"] else "%s %s" % (r.get("error"), err))

        # 7. The driver's newer host paths: cuMemCreate at a host location, a host memory pool.
        r = {"ok": False, "error": "CUDA only"} if a.hip else self.run("driver", mode="driver")[0]
        if a.hip:
            self.hip()
        elif not r["ok"]:
            self.check("7 driver host paths", False, "%s" % r.get("error"))
        else:
            if "vmm_size" in r:
                self.check("7 cuMemCreate host memory tracked", r["vmm_added"] == r["vmm_size"] and r["vmm_left"] == 0,
                           "location type %d: %d bytes created, %d counted, %d left after release (driver %d)" % (
                               r["vmm_location"], r["vmm_size"], r["vmm_added"], r["vmm_left"], r["driver_version"]))
            else:
                self.line("SKIP", "7 cuMemCreate host memory", "the driver refused host locations: %s" % {k: v for k, v in r.items() if k.startswith("vmm_rc")})
            if "pool_reserved" in r:
                self.check("7 host pool tracked", r["pool_added"] == r["pool_reserved"] and r["pool_left"] == 0,
                           "location type %d: %d bytes reserved, %d counted, %d left after trim and destroy" % (
                               r["pool_location"], r["pool_reserved"], r["pool_added"], r["pool_left"]))
            else:
                self.line("SKIP", "7 host pool", "the driver refused host pools: %s" % {k: v for k, v in r.items() if "rc" in k})

        # 9. Which counter each path moves, and nothing pinguard saw counted again from VmPin.
        r = self.run("counters", mode="counters")[0]
        if not r["ok"]:
            self.check("9 VmLck, VmPin, RssShmem per path", False, "%s" % r.get("error"))
        else:
            for name in ("cudaHostAlloc", "cudaHostRegister"):
                p = r[name]
                moved = ", ".join("%s %+d" % (k, p["moved"][k]) for k in COUNTERS)
                if p["rc"] != 0:
                    self.line("SKIP", "9 %s counters" % name, "the call answered %s" % p["rc"])
                    continue
                self.check("9 %s counters" % name, True, "%d bytes held: %s" % (COUNTER_BYTES, moved))
                self.check("9 %s not counted again as kernel-pinned" % name, p["kernel_pinned"] == 0,
                           "report's totals.kernel_pinned_bytes %s while held (%s)" % (p["kernel_pinned"], moved))
        # 10. Memory that is not RAM (IoMemory), and device memory on an integrated device.
        if a.hip:
            self.line("SKIP", "10 I/O memory and device memory", "CUDA only here")
        else:
            self.devmem()
        # 11. A range pinned by cudaHostRegister, then registered with the RDMA card: one count.
        if a.hip:
            self.line("SKIP", "11 card over a registered range", "CUDA only here")
        else:
            r = self.run("card", mode="card")[0]
            if r.get("skip"):
                self.line("SKIP", "11 card over a registered range", r["skip"])
            elif not r["ok"]:
                self.check("11 card over a registered range", False, "%s" % r.get("error"))
            else:
                once = r["register_rc"] == 0 and r["reg_mr"] and r["held_live"] == COUNTER_BYTES
                self.check("11 card over a registered range", once and not r["held_kernel_pinned"] and r["after_live"] == 0,
                           "cudaHostRegister rc %s, ibv_reg_mr %s: %d bytes live while both hold %d (kernel-pinned %s), %d after both let go" % (
                               r["register_rc"], "ok" if r["reg_mr"] else "failed", r["held_live"], COUNTER_BYTES,
                               r["held_kernel_pinned"], r["after_live"]))

        # 6. Throughput with and without pinguard, in the same run.
        r_without = self.run("speed-without", preload=False)[0]
        r_with = self.run("speed-with")[0]
        if r_without["ok"] and r_with["ok"]:
            ratio = (BATCHES / r_with["seconds"]) / (BATCHES / r_without["seconds"])
            self.check("6 throughput with pinguard", True, "%.1f batches/s with, %.1f without: ratio %.3f" % (
                BATCHES / r_with["seconds"], BATCHES / r_without["seconds"], ratio))
        else:
            self.check("6 throughput with pinguard", False, "%s / %s" % (r_without.get("error"), r_with.get("error")))
        print("# gpu-check: %s" % ("all checks passed" if not self.failed else "%d check(s) failed" % self.failed), flush=True)
        return 1 if self.failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="libpinguard.so to preload")
    ap.add_argument("--backend", choices=("torch", "emul"), default="torch")
    ap.add_argument("--emul-dir", default="", help="the emulated runtimes (backend emul)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per child")
    ap.add_argument("--hip", action="store_true", help="an AMD device (PyTorch for ROCm) or, with emul, the emulated HIP runtime")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if not args.lib or not os.path.isfile(args.lib):
        print("gpu-check: --lib %r is not a file" % args.lib, file=sys.stderr)
        return 2
    args.lib = os.path.abspath(args.lib)
    if args.backend == "emul" and not os.path.isfile(os.path.join(args.emul_dir, "libamdhip64.so.5" if args.hip else "libframework.so")):
        print("gpu-check: --emul-dir %r has no emulated runtime (scripts/build-fixtures.sh builds one)" % args.emul_dir, file=sys.stderr)
        return 2
    return Checks(args).all()


if __name__ == "__main__":
    sys.exit(main())
