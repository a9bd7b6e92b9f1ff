//! The intercepted entry points and the families `PINGUARD_HOOKS` switches.

/// A hook family, as named in `PINGUARD_HOOKS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Cuda,
    CudaDriver,
    Acl,
    Mlock,
    Hip,
    Ibverbs,
    AscendHal,
}

impl Family {
    pub const ALL: [Family; 7] = [
        Family::Cuda,
        Family::CudaDriver,
        Family::Acl,
        Family::Mlock,
        Family::Hip,
        Family::Ibverbs,
        Family::AscendHal,
    ];

    /// As `PINGUARD_HOOKS` names it: the registry's list, in this enum's order.
    pub fn name(self) -> &'static str {
        pinguard_common::vars::FAMILIES[self as usize]
    }

    pub fn bit(self) -> u8 {
        1 << self as u8
    }
}

macro_rules! apis {
    ($($variant:ident = $name:literal;)*) => {
        /// Every entry point pinguard counts under its own name in the report's `apis`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u8)]
        pub enum Api { $($variant),* }

        impl Api {
            pub const ALL: &'static [Api] = &[$(Api::$variant),*];
            pub const COUNT: usize = Api::ALL.len();

            pub fn name(self) -> &'static str {
                match self { $(Api::$variant => $name),* }
            }
        }
    };
}

apis! {
    CudaHostAlloc = "cudaHostAlloc";
    CudaMallocHost = "cudaMallocHost";
    CudaHostRegister = "cudaHostRegister";
    CudaFreeHost = "cudaFreeHost";
    CudaHostUnregister = "cudaHostUnregister";
    CuMemHostAlloc = "cuMemHostAlloc";
    CuMemAllocHostV2 = "cuMemAllocHost_v2";
    CuMemAllocHost = "cuMemAllocHost";
    CuMemHostRegisterV2 = "cuMemHostRegister_v2";
    CuMemHostRegister = "cuMemHostRegister";
    CuMemFreeHost = "cuMemFreeHost";
    CuMemHostUnregister = "cuMemHostUnregister";
    AclrtMallocHost = "aclrtMallocHost";
    AclrtMallocHostWithCfg = "aclrtMallocHostWithCfg";
    AclrtHostRegister = "aclrtHostRegister";
    AclrtHostRegisterV2 = "aclrtHostRegisterV2";
    AclrtFreeHost = "aclrtFreeHost";
    AclrtHostUnregister = "aclrtHostUnregister";
    CuMemCreate = "cuMemCreate";
    CuMemRelease = "cuMemRelease";
    CuMemMap = "cuMemMap";
    CuMemUnmap = "cuMemUnmap";
    CuMemRetainAllocationHandle = "cuMemRetainAllocationHandle";
    AclrtMallocPhysical = "aclrtMallocPhysical";
    AclrtFreePhysical = "aclrtFreePhysical";
    AclrtMapMem = "aclrtMapMem";
    AclrtUnmapMem = "aclrtUnmapMem";
    AclrtMemRetainAllocationHandle = "aclrtMemRetainAllocationHandle";
    CuMemPoolCreate = "cuMemPoolCreate";
    CuMemAllocFromPoolAsync = "cuMemAllocFromPoolAsync";
    CuMemFreeAsync = "cuMemFreeAsync";
    CuMemPoolTrimTo = "cuMemPoolTrimTo";
    CuMemPoolDestroy = "cuMemPoolDestroy";
    CudaMemPoolCreate = "cudaMemPoolCreate";
    CudaMallocFromPoolAsync = "cudaMallocFromPoolAsync";
    CudaFreeAsync = "cudaFreeAsync";
    CudaMemPoolTrimTo = "cudaMemPoolTrimTo";
    CudaMemPoolDestroy = "cudaMemPoolDestroy";
    CuMemGetDefaultMemPool = "cuMemGetDefaultMemPool";
    CuMemGetMemPool = "cuMemGetMemPool";
    CudaMemGetDefaultMemPool = "cudaMemGetDefaultMemPool";
    CudaMemGetMemPool = "cudaMemGetMemPool";
    Mlock = "mlock";
    Mlock2 = "mlock2";
    Mlockall = "mlockall";
    Mmap = "mmap";
    Munlock = "munlock";
    Munlockall = "munlockall";
    Munmap = "munmap";
    HipHostMalloc = "hipHostMalloc";
    HipHostAlloc = "hipHostAlloc";
    HipExtHostAlloc = "hipExtHostAlloc";
    HipMallocHost = "hipMallocHost";
    HipMemAllocHost = "hipMemAllocHost";
    HipHostFree = "hipHostFree";
    HipFreeHost = "hipFreeHost";
    HipHostRegister = "hipHostRegister";
    HipHostUnregister = "hipHostUnregister";
    HipMemPoolCreate = "hipMemPoolCreate";
    HipMallocFromPoolAsync = "hipMallocFromPoolAsync";
    HipFreeAsync = "hipFreeAsync";
    HipMemPoolTrimTo = "hipMemPoolTrimTo";
    HipMemPoolDestroy = "hipMemPoolDestroy";
    HipMemRelease = "hipMemRelease";
    HipMemMap = "hipMemMap";
    HipMemUnmap = "hipMemUnmap";
    HipMemRetainAllocationHandle = "hipMemRetainAllocationHandle";
    // Past the 64th: a callsite's bit for it is in the second word (tests/hip.rs reads it back).
    HipMemCreate = "hipMemCreate";
    IbvRegMr = "ibv_reg_mr";
    IbvRegMrIova = "ibv_reg_mr_iova";
    IbvRegMrIova2 = "ibv_reg_mr_iova2";
    IbvRegDmabufMr = "ibv_reg_dmabuf_mr";
    // Any of the three `ibv_reg_mr` names with `IBV_ACCESS_ON_DEMAND`: pins nothing, shown apart.
    IbvRegMrOnDemand = "ibv_reg_mr(ON_DEMAND)";
    IbvReregMr = "ibv_rereg_mr";
    IbvDeregMr = "ibv_dereg_mr";
    HalHostRegister = "halHostRegister";
    HalHostUnregister = "halHostUnregister";
    HalHostUnregisterEx = "halHostUnregisterEx";
    HalMemCreate = "halMemCreate";
    HalMemRelease = "halMemRelease";
    HalMemMap = "halMemMap";
    HalMemUnmap = "halMemUnmap";
    // Registrations of I/O memory (a device's registers, a NIC's doorbells): no host RAM, passed
    // through whatever the budget, recorded with no bytes under these names.
    CudaHostRegisterIoMemory = "cudaHostRegister(IoMemory)";
    CuMemHostRegisterIoMemory = "cuMemHostRegister(IOMEMORY)";
    HipHostRegisterIoMemory = "hipHostRegister(IoMemory)";
    // Device allocations, counted as host bytes only where the device's memory is the host's
    // (`PINGUARD_DEVICE_MEMORY`).
    CudaMalloc = "cudaMalloc";
    CudaMallocManaged = "cudaMallocManaged";
    CudaFree = "cudaFree";
    CuMemAllocV2 = "cuMemAlloc_v2";
    CuMemAllocManaged = "cuMemAllocManaged";
    CuMemFreeV2 = "cuMemFree_v2";
    HipMalloc = "hipMalloc";
    HipMallocManaged = "hipMallocManaged";
    HipFree = "hipFree";
}

impl Api {
    /// Whether its live record is kept under the address of the memory it pinned, with the size
    /// it pinned (the runtimes' host allocations and registrations): the records whose ranges a
    /// registration of the same memory by another route is compared with (issue 45 item 2).
    /// Handles (RDMA registrations, physical allocations, pools) are kept under other keys.
    pub fn keyed_by_address(self) -> bool {
        use Api::*;
        matches!(
            self,
            CudaHostAlloc
                | CudaMallocHost
                | CudaHostRegister
                | CuMemHostAlloc
                | CuMemAllocHostV2
                | CuMemAllocHost
                | CuMemHostRegisterV2
                | CuMemHostRegister
                | AclrtMallocHost
                | AclrtMallocHostWithCfg
                | AclrtHostRegister
                | AclrtHostRegisterV2
                | HipHostMalloc
                | HipHostAlloc
                | HipExtHostAlloc
                | HipMallocHost
                | HipMemAllocHost
                | HipHostRegister
                | HalHostRegister
        )
    }
}
