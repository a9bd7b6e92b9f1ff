//! `pinguard doctor --probe`: pins a bounded amount through each path this process can reach
//! (`mlock`; `cudaHostAlloc`, `cudaHostRegister`, `aclrtMallocHost` and `hipHostMalloc` where a
//! runtime loads) and
//! says whether the cgroup's usage and the host's `MemAvailable` moved by it, and which of the
//! process's own counters (`VmLck`, `VmPin`, `RssShmem`) the path moves. Pages a driver
//! allocates itself are often not charged to the cgroup; user pages locked or registered are.

use crate::doctor_facts::{meminfo_kb, read, usage, CgroupFacts, Rlimit};
use pinguard_common::cgroup::Place;
use pinguard_common::codes::{self, Space};
use pinguard_common::units::format_bytes;
use serde::Serialize;
use std::ffi::{c_void, CStr};

/// Rounds per path: the median of the usage moves, so that another process of the cgroup
/// allocating during one round does not decide the answer.
const ROUNDS: usize = 3;

#[derive(Serialize)]
pub struct Probe {
    pub path: &'static str,
    pub bytes: u64,
    /// How far the cgroup's usage rose while the probe held its pin (median of the rounds).
    pub usage_delta_bytes: Option<i64>,
    /// How far the host's MemAvailable fell meanwhile.
    pub available_drop_bytes: Option<i64>,
    /// Whether the cgroup's limit counts this path: usage rose by at least 3/4 of the pin.
    pub counted: Option<bool>,
    /// How far this process's `VmLck`, `VmPin` and `RssShmem` moved while the pin was held
    /// (median of the rounds): which counter the path moves (the kernel checks `RLIMIT_MEMLOCK`
    /// against `VmLck` for `mlock`, against `VmPin` for a card's or `io_uring`'s pins).
    pub vm_lck_delta_bytes: Option<i64>,
    pub vm_pin_delta_bytes: Option<i64>,
    pub rss_shmem_delta_bytes: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The status counters a probe compares: `VmLck`, `VmPin`, `RssShmem`.
const COUNTERS: [&str; 3] = ["VmLck", "VmPin", "RssShmem"];

/// `COUNTERS` from one read of `/proc/self/status`, in bytes.
fn counters() -> [Option<u64>; 3] {
    let text = read("/proc/self/status").unwrap_or_default();
    COUNTERS.map(|key| {
        text.lines().find_map(|l| {
            let kb = l.strip_prefix(key)?.strip_prefix(':')?.trim();
            Some(kb.strip_suffix("kB")?.trim().parse::<u64>().ok()? * 1024)
        })
    })
}

/// How much each probe pins, and why that much.
#[derive(Serialize)]
pub struct ProbeSize {
    pub bytes: u64,
    /// `asked` (`--probe-size`), or what bounded the default.
    pub chosen: String,
}

/// What a probe pins unless told, when nothing here asks for less.
const DEFAULT: u64 = 32 << 20;
/// The least worth measuring: below it another process's allocations drown the move.
const SMALLEST: u64 = 1 << 20;

/// The probe's size: as asked, else the default bounded by a quarter of the cgroup's headroom
/// (three rounds hold one probe at a time, with room to spare for the process itself) and by
/// what `RLIMIT_MEMLOCK` leaves this process when it binds (without `CAP_IPC_LOCK`).
pub fn size(asked: Option<u64>, cgroup: Option<&CgroupFacts>, rlimit: &Rlimit) -> ProbeSize {
    if let Some(bytes) = asked {
        return ProbeSize {
            bytes,
            chosen: "as asked (--probe-size)".into(),
        };
    }
    let mut bytes = DEFAULT;
    let mut why = vec![format!("the default {}", format_bytes(DEFAULT))];
    if let Some(h) = cgroup.and_then(|c| c.headroom_bytes) {
        if h / 4 < bytes {
            bytes = h / 4;
            why = vec![format!(
                "a quarter of the cgroup's headroom of {}",
                format_bytes(h)
            )];
        }
    }
    if let (Some(true), Some(soft)) = (rlimit.binds, rlimit.soft_bytes) {
        let room = soft.saturating_sub(rlimit.vm_lck_bytes.unwrap_or(0));
        if room < bytes {
            bytes = room;
            why = vec![format!(
                "what RLIMIT_MEMLOCK ({}) leaves this process without CAP_IPC_LOCK, {} already locked",
                format_bytes(soft),
                format_bytes(rlimit.vm_lck_bytes.unwrap_or(0))
            )];
        }
    }
    // Whole mebibytes; never below the least worth measuring (the probe then says it cannot).
    let bytes = (bytes & !(SMALLEST - 1)).max(SMALLEST);
    ProbeSize {
        bytes,
        chosen: format!("{}; --probe-size sets it", why.join(", ")),
    }
}

type Release = Box<dyn FnOnce()>;
type Pin = dyn Fn(u64) -> Result<Release, String>;

fn not_probed(path: &'static str, bytes: u64, why: String) -> Probe {
    Probe {
        path,
        bytes,
        usage_delta_bytes: None,
        available_drop_bytes: None,
        counted: None,
        vm_lck_delta_bytes: None,
        vm_pin_delta_bytes: None,
        rss_shmem_delta_bytes: None,
        note: Some(why),
    }
}

fn median(mut v: Vec<i64>) -> Option<i64> {
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

/// How long the kernel takes to fold its per-CPU page counts into `/proc/meminfo`
/// (`vm.stat_interval`, one second by default): the cgroup's own count is exact at once.
fn meminfo_lag() -> std::time::Duration {
    let secs = read("/proc/sys/vm/stat_interval")
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(1);
    std::time::Duration::from_millis(secs.min(5) * 1000 + 200)
}

fn measure(path: &'static str, place: Option<&Place>, bytes: u64, pin: &Pin) -> Probe {
    let (mut used, mut avail) = (Vec::new(), Vec::new());
    let mut moved: [Vec<i64>; 3] = Default::default();
    for round in 0..ROUNDS {
        let (u0, a0) = (place.and_then(usage), meminfo_kb("MemAvailable"));
        let c0 = counters();
        let release = match pin(bytes) {
            Ok(r) => r,
            Err(e) => return not_probed(path, bytes, format!("could not pin: {e}")),
        };
        let u1 = place.and_then(usage);
        for (i, (a, b)) in c0.iter().zip(counters()).enumerate() {
            if let (Some(a), Some(b)) = (a, b) {
                moved[i].push(b as i64 - *a as i64);
            }
        }
        // The host's figure once per path: it needs the kernel's counters folded in.
        let a1 = if round == 0 {
            std::thread::sleep(meminfo_lag());
            meminfo_kb("MemAvailable")
        } else {
            None
        };
        release();
        if let (Some(a), Some(b)) = (u0, u1) {
            used.push(b as i64 - a as i64);
        }
        if let (Some(a), Some(b)) = (a0, a1) {
            avail.push(a as i64 - b as i64);
        }
    }
    let usage_delta_bytes = median(used);
    let counted = usage_delta_bytes.map(|d| d >= (bytes as i64) * 3 / 4);
    let [lck, pin, shmem] = moved.map(median);
    Probe {
        path,
        bytes,
        usage_delta_bytes,
        available_drop_bytes: median(avail),
        counted,
        vm_lck_delta_bytes: lck,
        vm_pin_delta_bytes: pin,
        rss_shmem_delta_bytes: shmem,
        note: None,
    }
}

fn errno_text() -> String {
    std::io::Error::last_os_error().to_string()
}

/// Fresh anonymous memory, never touched: whatever charges it is the pinning call itself.
fn anon(bytes: u64) -> Result<*mut c_void, String> {
    // SAFETY: a new private anonymous mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(errno_text());
    }
    Ok(p)
}

fn unmap(p: *mut c_void, bytes: u64) {
    // SAFETY: `p` is a mapping of `bytes` that `anon` made and nothing else refers to.
    unsafe { libc::munmap(p, bytes as usize) };
}

fn pin_mlock(bytes: u64) -> Result<Release, String> {
    let p = anon(bytes)?;
    // SAFETY: `p` is our own mapping of `bytes`; mlock faults its pages in and locks them.
    if unsafe { libc::mlock(p, bytes as usize) } != 0 {
        let e = errno_text();
        unmap(p, bytes);
        return Err(e);
    }
    Ok(Box::new(move || unmap(p, bytes)))
}

/// A runtime library, opened once for the probe and never closed (a runtime may not unload).
#[derive(Clone, Copy)]
struct Lib(*mut c_void);

impl Lib {
    fn open(names: &[&CStr]) -> Option<Lib> {
        names.iter().find_map(|n| {
            // SAFETY: dlopen of a NUL-terminated name; a runtime's constructors run as they would
            // in any program that links it.
            let h = unsafe { libc::dlopen(n.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            (!h.is_null()).then_some(Lib(h))
        })
    }

    fn sym(&self, name: &CStr) -> Option<*mut c_void> {
        // SAFETY: `self.0` is a live handle from dlopen, `name` is NUL-terminated.
        let p = unsafe { libc::dlsym(self.0, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    }
}

type Alloc = unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> i32;
type Free = unsafe extern "C" fn(*mut c_void) -> i32;
type Register = unsafe extern "C" fn(*mut c_void, usize, u32) -> i32;
type AclAlloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> i32;

/// `hipErrorInvalidDevice (101)`: the runtime's own name for its code (`cudaGetErrorName`,
/// `hipGetErrorName`), else the headers' (`pinguard_common::codes`), else the number alone.
fn named(lib: &Lib, space: Space, rc: i32) -> String {
    let own = match space {
        Space::CudaRuntime => Some(c"cudaGetErrorName"),
        Space::Hip => Some(c"hipGetErrorName"),
        _ => None,
    };
    let from_runtime =
        own.and_then(|f| lib.sym(f)).and_then(|f| {
            // SAFETY: `const char *xGetErrorName(int)`, the runtime's own function; it answers a
            // static string (never freed) for any code.
            let p = unsafe {
                std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(i32) -> *const std::ffi::c_char,
                >(f)(rc)
            };
            // SAFETY: a NUL-terminated static string when not null.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        });
    match from_runtime
        .filter(|n| !n.is_empty() && !n.ends_with("Unknown"))
        .or_else(|| codes::name(space, rc).map(str::to_string))
    {
        Some(name) => format!("{name} ({rc})"),
        None => rc.to_string(),
    }
}

/// `; hipGetDeviceCount: hipErrorNoDevice (100), no device`: why HIP refused, where it says.
fn hip_devices(lib: &Lib) -> String {
    let Some(f) = lib.sym(c"hipGetDeviceCount") else {
        return String::new();
    };
    let mut n: i32 = 0;
    // SAFETY: `hipError_t hipGetDeviceCount(int *count)`, the runtime's own function.
    let rc = unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut i32) -> i32>(f)(&mut n)
    };
    match rc {
        0 => format!("; hipGetDeviceCount: {n} devices"),
        rc => format!(
            "; hipGetDeviceCount: {}, no usable device",
            named(lib, Space::Hip, rc)
        ),
    }
}

fn cuda_probes(place: Option<&Place>, bytes: u64) -> Vec<Probe> {
    let Some(lib) = Lib::open(&[c"libcudart.so", c"libcudart.so.12", c"libcudart.so.11.0"]) else {
        let why = "not probed: no CUDA runtime (libcudart.so) loads here".to_string();
        return vec![
            not_probed("cudaHostAlloc", bytes, why.clone()),
            not_probed("cudaHostRegister", bytes, why),
        ];
    };
    let syms = |a: &CStr, b: &CStr| Some((lib.sym(a)?, lib.sym(b)?));
    let mut out = Vec::new();
    match syms(c"cudaHostAlloc", c"cudaFreeHost") {
        Some((a, f)) => {
            // SAFETY: the CUDA runtime's own symbols, with their documented signatures.
            let (alloc, free) = unsafe {
                (
                    std::mem::transmute::<*mut c_void, Alloc>(a),
                    std::mem::transmute::<*mut c_void, Free>(f),
                )
            };
            out.push(measure("cudaHostAlloc", place, bytes, &move |n| {
                let mut p = std::ptr::null_mut();
                // SAFETY: cudaHostAlloc writes the new pointer into `p`; flags 0 is the default.
                let rc = unsafe { alloc(&mut p, n as usize, 0) };
                if rc == 0 {
                    // SAFETY: `p` came from cudaHostAlloc above and is freed once.
                    Ok(Box::new(move || unsafe {
                        free(p);
                    }) as Release)
                } else {
                    Err(format!(
                        "cudaHostAlloc returned {}",
                        named(&lib, Space::CudaRuntime, rc)
                    ))
                }
            }));
        }
        None => out.push(not_probed(
            "cudaHostAlloc",
            bytes,
            "not probed: libcudart.so has no cudaHostAlloc".into(),
        )),
    }
    match syms(c"cudaHostRegister", c"cudaHostUnregister") {
        Some((r, u)) => {
            // SAFETY: the CUDA runtime's own symbols, with their documented signatures.
            let (reg, unreg) = unsafe {
                (
                    std::mem::transmute::<*mut c_void, Register>(r),
                    std::mem::transmute::<*mut c_void, Free>(u),
                )
            };
            out.push(measure("cudaHostRegister", place, bytes, &move |n| {
                let p = anon(n)?;
                // SAFETY: `p` is our own mapping of `n` bytes, registered once and unregistered once.
                let rc = unsafe { reg(p, n as usize, 0) };
                if rc != 0 {
                    unmap(p, n);
                    return Err(format!(
                        "cudaHostRegister returned {}",
                        named(&lib, Space::CudaRuntime, rc)
                    ));
                }
                Ok(Box::new(move || {
                    // SAFETY: `p` was registered above.
                    unsafe { unreg(p) };
                    unmap(p, n);
                }) as Release)
            }));
        }
        None => out.push(not_probed(
            "cudaHostRegister",
            bytes,
            "not probed: libcudart.so has no cudaHostRegister".into(),
        )),
    }
    out
}

fn acl_probe(place: Option<&Place>, bytes: u64) -> Probe {
    let Some(lib) = Lib::open(&[c"libascendcl.so"]) else {
        return not_probed(
            "aclrtMallocHost",
            bytes,
            "not probed: no Ascend runtime (libascendcl.so) loads here".into(),
        );
    };
    let (Some(a), Some(f)) = (lib.sym(c"aclrtMallocHost"), lib.sym(c"aclrtFreeHost")) else {
        return not_probed(
            "aclrtMallocHost",
            bytes,
            "not probed: libascendcl.so has no aclrtMallocHost".into(),
        );
    };
    if let Some(init) = lib.sym(c"aclInit") {
        // SAFETY: aclInit(const char *config) with no configuration file; an error (already
        // initialised) leaves the runtime usable.
        unsafe {
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*const i8) -> i32>(init)(
                std::ptr::null(),
            )
        };
    }
    // SAFETY: the Ascend runtime's own symbols, with their documented signatures.
    let (alloc, free) = unsafe {
        (
            std::mem::transmute::<*mut c_void, AclAlloc>(a),
            std::mem::transmute::<*mut c_void, Free>(f),
        )
    };
    measure("aclrtMallocHost", place, bytes, &move |n| {
        let mut p = std::ptr::null_mut();
        // SAFETY: aclrtMallocHost writes the new pointer into `p`.
        let rc = unsafe { alloc(&mut p, n as usize) };
        if rc == 0 {
            // SAFETY: `p` came from aclrtMallocHost above and is freed once.
            Ok(Box::new(move || unsafe {
                free(p);
            }) as Release)
        } else {
            Err(format!(
                "aclrtMallocHost returned {}",
                named(&lib, Space::Acl, rc)
            ))
        }
    })
}

/// `hipHostMalloc` (AMD's HIP runtime): without a device it answers an error (5.2.3:
/// `hipErrorInvalidDevice`, 101), said by name in the probe's note with `hipGetDeviceCount`'s.
fn hip_probe(place: Option<&Place>, bytes: u64) -> Probe {
    let Some(lib) = Lib::open(&[
        c"libamdhip64.so.7",
        c"libamdhip64.so.6",
        c"libamdhip64.so.5",
        c"libamdhip64.so",
    ]) else {
        return not_probed(
            "hipHostMalloc",
            bytes,
            "not probed: no HIP runtime (libamdhip64.so) loads here".into(),
        );
    };
    let (Some(a), Some(f)) = (lib.sym(c"hipHostMalloc"), lib.sym(c"hipHostFree")) else {
        return not_probed(
            "hipHostMalloc",
            bytes,
            "not probed: libamdhip64.so has no hipHostMalloc".into(),
        );
    };
    // SAFETY: the HIP runtime's own symbols, with their documented signatures.
    let (alloc, free) = unsafe {
        (
            std::mem::transmute::<*mut c_void, Alloc>(a),
            std::mem::transmute::<*mut c_void, Free>(f),
        )
    };
    measure("hipHostMalloc", place, bytes, &move |n| {
        let mut p = std::ptr::null_mut();
        // SAFETY: hipHostMalloc writes the new pointer into `p`; flags 0 is hipHostMallocDefault.
        let rc = unsafe { alloc(&mut p, n as usize, 0) };
        if rc == 0 {
            // SAFETY: `p` came from hipHostMalloc above and is freed once.
            Ok(Box::new(move || unsafe {
                free(p);
            }) as Release)
        } else {
            Err(format!(
                "hipHostMalloc returned {}{}",
                named(&lib, Space::Hip, rc),
                hip_devices(&lib)
            ))
        }
    })
}

/// Every path, unless the cgroup is too close to its limit for a probe to be harmless.
pub fn run_all(cgroup: Option<&CgroupFacts>, bytes: u64) -> Vec<Probe> {
    if let Some(h) = cgroup
        .and_then(|c| c.headroom_bytes)
        .filter(|&h| h < 4 * bytes)
    {
        let why = format!(
            "not probed: the cgroup's headroom ({}) is below 4 times the probe ({})",
            format_bytes(h),
            format_bytes(bytes)
        );
        return [
            "mlock",
            "cudaHostAlloc",
            "cudaHostRegister",
            "aclrtMallocHost",
            "hipHostMalloc",
        ]
        .into_iter()
        .map(|p| not_probed(p, bytes, why.clone()))
        .collect();
    }
    let place = cgroup.map(|c| &c.place);
    let mut out = vec![measure("mlock", place, bytes, &pin_mlock)];
    out.extend(cuda_probes(place, bytes));
    out.push(acl_probe(place, bytes));
    out.push(hip_probe(place, bytes));
    out
}

fn signed(v: i64) -> String {
    let s = format_bytes(v.unsigned_abs());
    if v < 0 {
        format!("-{s}")
    } else {
        format!("+{s}")
    }
}

pub fn render(s: &mut String, probes: &[Probe], size: &ProbeSize) {
    s.push_str(&format!(
        "\nprobe of {} ({}; each path pinned, measured while held, released):\n",
        format_bytes(size.bytes),
        size.chosen
    ));
    for p in probes {
        let moved = |v: Option<i64>| v.map(signed).unwrap_or_else(|| "unknown".into());
        let line = match (p.counted, &p.note) {
            (_, Some(n)) => n.clone(),
            (c, None) => format!(
                "{}: cgroup usage {} for {} pinned, host MemAvailable {}; VmLck {}, VmPin {}, RssShmem {}",
                match c {
                    Some(true) => "counted by the limit",
                    Some(false) => "NOT counted by the limit",
                    None => "unknown (no usage figure)",
                },
                moved(p.usage_delta_bytes),
                format_bytes(p.bytes),
                moved(p.available_drop_bytes.map(|d| -d)),
                moved(p.vm_lck_delta_bytes),
                moved(p.vm_pin_delta_bytes),
                moved(p.rss_shmem_delta_bytes),
            ),
        };
        s.push_str(&format!("  {:<17} {line}\n", p.path));
    }
}
