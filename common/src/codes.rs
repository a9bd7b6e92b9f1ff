//! The names of the codes pinning calls answer, by entry point (`cudaHostAlloc` answers
//! `cudaError_t`, `cuMemHostAlloc` `CUresult`, `mlock` an errno): what a refused or failed call's
//! event and line say, and what `pinguard doctor` says of a runtime's answer. From each API's
//! headers; a code not listed is shown as its number.

/// Which code space an entry point answers in, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    CudaRuntime,
    CudaDriver,
    Hip,
    Acl,
    AscendHal,
    /// `errno`: the locking family and rdma-core.
    Errno,
}

impl Space {
    pub fn of(api: &str) -> Space {
        if api.starts_with("cuda") {
            Space::CudaRuntime
        } else if api.starts_with("cu") {
            Space::CudaDriver
        } else if api.starts_with("hip") {
            Space::Hip
        } else if api.starts_with("acl") {
            Space::Acl
        } else if api.starts_with("hal") {
            Space::AscendHal
        } else {
            Space::Errno
        }
    }

    /// What pinguard answers itself when it refuses a call of `api` (the API's out-of-memory).
    pub fn refusal(api: &str) -> &'static str {
        match Space::of(api) {
            Space::CudaRuntime => "cudaErrorMemoryAllocation (2)",
            Space::CudaDriver => "CUDA_ERROR_OUT_OF_MEMORY (2)",
            Space::Hip => "hipErrorOutOfMemory (2)",
            Space::Acl => "ACL_ERROR_RT_MEMORY_ALLOCATION (207001)",
            Space::AscendHal => "DRV_ERROR_OUT_OF_MEMORY (6)",
            // As the kernel over RLIMIT_MEMLOCK: mmap(MAP_LOCKED), mlockall, mremap say EAGAIN.
            Space::Errno if matches!(api, "mmap" | "mlockall" | "mremap") => "EAGAIN",
            Space::Errno => "ENOMEM",
        }
    }
}

const CUDA_RUNTIME: &[(i32, &str)] = &[
    (1, "cudaErrorInvalidValue"),
    (2, "cudaErrorMemoryAllocation"),
    (3, "cudaErrorInitializationError"),
    (35, "cudaErrorInsufficientDriver"),
    (46, "cudaErrorDevicesUnavailable"),
    (100, "cudaErrorNoDevice"),
    (101, "cudaErrorInvalidDevice"),
    (712, "cudaErrorHostMemoryAlreadyRegistered"),
    (713, "cudaErrorHostMemoryNotRegistered"),
    (801, "cudaErrorNotSupported"),
    (999, "cudaErrorUnknown"),
];
const CUDA_DRIVER: &[(i32, &str)] = &[
    (1, "CUDA_ERROR_INVALID_VALUE"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY"),
    (3, "CUDA_ERROR_NOT_INITIALIZED"),
    (100, "CUDA_ERROR_NO_DEVICE"),
    (101, "CUDA_ERROR_INVALID_DEVICE"),
    (712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"),
    (713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"),
    (801, "CUDA_ERROR_NOT_SUPPORTED"),
    (999, "CUDA_ERROR_UNKNOWN"),
];
const HIP: &[(i32, &str)] = &[
    (1, "hipErrorInvalidValue"),
    (2, "hipErrorOutOfMemory"),
    (3, "hipErrorNotInitialized"),
    (35, "hipErrorInsufficientDriver"),
    (100, "hipErrorNoDevice"),
    (101, "hipErrorInvalidDevice"),
    (712, "hipErrorHostMemoryAlreadyRegistered"),
    (713, "hipErrorHostMemoryNotRegistered"),
    (801, "hipErrorNotSupported"),
    (999, "hipErrorUnknown"),
];
const ACL: &[(i32, &str)] = &[
    (100000, "ACL_ERROR_INVALID_PARAM"),
    (100001, "ACL_ERROR_UNINITIALIZE"),
    (100002, "ACL_ERROR_REPEAT_INITIALIZE"),
    (200000, "ACL_ERROR_BAD_ALLOC"),
    (207000, "ACL_ERROR_RT_FEATURE_NOT_SUPPORT"),
    (207001, "ACL_ERROR_RT_MEMORY_ALLOCATION"),
    (507899, "ACL_ERROR_RT_DRV_INTERNAL_ERROR"),
];
const HAL: &[(i32, &str)] = &[
    (3, "DRV_ERROR_INVALID_VALUE"),
    (6, "DRV_ERROR_OUT_OF_MEMORY"),
    (0xfffe, "DRV_ERROR_NOT_SUPPORT"),
];
const ERRNO: &[(i32, &str)] = &[
    (1, "EPERM"),
    (4, "EINTR"),
    (11, "EAGAIN"),
    (12, "ENOMEM"),
    (14, "EFAULT"),
    (16, "EBUSY"),
    (22, "EINVAL"),
    (95, "EOPNOTSUPP"),
];

/// The header's name of `code` in `space`.
pub fn name(space: Space, code: i32) -> Option<&'static str> {
    let table = match space {
        Space::CudaRuntime => CUDA_RUNTIME,
        Space::CudaDriver => CUDA_DRIVER,
        Space::Hip => HIP,
        Space::Acl => ACL,
        Space::AscendHal => HAL,
        Space::Errno => ERRNO,
    };
    table.iter().find(|(c, _)| *c == code).map(|(_, n)| *n)
}

/// `cudaErrorMemoryAllocation (2)`, `ENOMEM`, or the number where the name is not known.
pub fn named(api: &str, code: i32) -> String {
    let space = Space::of(api);
    match (name(space, code), space) {
        (Some(n), Space::Errno) => n.to_string(),
        (Some(n), _) => format!("{n} ({code})"),
        (None, Space::Errno) => format!("errno {code}"),
        (None, _) => code.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_by_entry_point() {
        assert_eq!(named("cudaHostAlloc", 2), "cudaErrorMemoryAllocation (2)");
        assert_eq!(named("cuMemHostAlloc", 2), "CUDA_ERROR_OUT_OF_MEMORY (2)");
        assert_eq!(named("hipHostMalloc", 101), "hipErrorInvalidDevice (101)");
        assert_eq!(named("mlock", 12), "ENOMEM");
        assert_eq!(named("aclrtMallocHost", 4242), "4242");
        assert_eq!(Space::refusal("mmap"), "EAGAIN");
    }
}
