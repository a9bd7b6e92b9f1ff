//! Registering memory that is already pinned. torch_npu with `pinned_mem_register:True`
//! allocates each block with `aclrtMallocHostWithCfg`, registers the same block with
//! `aclrtHostRegisterV2(p, n, 2)` to map it for the device, and on free unregisters, then frees.
//! Pinned bytes are pages: such a registration adds no pinned bytes, the budget is charged once,
//! and each release removes exactly its own record, in either order. CUDA refuses to register
//! memory it pinned itself, and pinguard passes that answer on.

use crate::common;
use common::*;

const MIB: i64 = 1 << 20;
/// `MIB` as the report's byte counts are typed.
const MIB_BYTES: u64 = 1 << 20;

#[test]
fn torch_npu_registering_its_own_pinned_blocks_counts_each_block_once() {
    // Two 4 MiB blocks under a 9 MiB budget: charged twice, the second registration would not fit.
    let orders: [&[&str]; 2] = [
        // unregister, then free (torch_npu's order)
        &[
            "acl_unregister:0",
            "acl_free:0",
            "acl_unregister:1",
            "acl_free:1",
        ],
        // free while still registered, then unregister
        &[
            "acl_free:0",
            "acl_unregister:0",
            "acl_free:1",
            "acl_unregister:1",
        ],
    ];
    for ends in orders {
        let mut ops = vec![
            "acl_malloc_cfg:4194304",
            "acl_register2_slot:0:2",
            "acl_malloc_cfg:4194304",
            "acl_register2_slot:1:2",
        ];
        ops.extend_from_slice(ends);
        let r = run("scenario", &ops, &[("PINGUARD_BUDGET", "9M")]);
        assert!(r.success(), "{}", r.stderr);
        assert!(r.rcs().iter().all(|&rc| rc == 0), "{ends:?}: {}", r.stdout);
        let s = r.stats();
        assert_eq!(
            s["acl"]["max_outstanding_bytes"],
            8 * MIB,
            "the runtime's own figure: {s}"
        );
        assert_eq!(s["acl"]["outstanding_bytes"], 0);
        assert_eq!(s["pinguard_live_bytes"], 0, "{ends:?}");
        let rep = r.typed_report();
        let t = &rep.totals;
        assert_eq!(t.peak_live_bytes, 8 * MIB_BYTES, "{ends:?}: {t:?}");
        assert_eq!(t.alloc_bytes, 8 * MIB_BYTES, "{ends:?}: {t:?}");
        assert_eq!(t.live_bytes, 0);
        assert_eq!(t.live_count, 0);
        assert_eq!(
            t.unknown_release_count, 0,
            "{ends:?}: each release found its own record"
        );
        assert_eq!(
            t.denied_count, 0,
            "{ends:?}: the budget was charged once per block"
        );
        assert_eq!(t.release_count, 4);
        let register = api_stats(&rep, "aclrtHostRegisterV2");
        assert_eq!(register.alloc_count, 2);
        assert_eq!(register.alloc_bytes, 0);
    }
}

/// While a block and its registration are both live, the report lists both records, the
/// registration adding nothing; a killed process's figures say the same.
#[test]
fn a_registration_over_a_block_is_live_with_no_bytes_of_its_own() {
    let r = run(
        "scenario",
        &["acl_malloc_cfg:4194304", "acl_register_slot:0"],
        &[],
    );
    assert!(r.success(), "{}", r.stderr);
    assert_eq!(r.rcs(), vec![0, 0]);
    assert_eq!(r.stats()["pinguard_live_bytes"], 4 * MIB);
    let rep = r.typed_report();
    assert_eq!(rep.totals.live_bytes, 4 * MIB_BYTES);
    assert_eq!(rep.totals.live_count, 2);
    let sizes: Vec<(String, i64)> = rep
        .live
        .iter()
        .map(|l| (l.api.to_string(), l.size as i64))
        .collect();
    assert!(
        sizes.contains(&("aclrtMallocHostWithCfg".to_string(), 4 * MIB)),
        "{sizes:?}"
    );
    assert!(
        sizes.contains(&("aclrtHostRegister".to_string(), 0)),
        "{sizes:?}"
    );
}

/// CUDA refuses to register memory it pinned (`cudaErrorHostMemoryAlreadyRegistered`, 712):
/// that answer reaches the program, nothing is counted for it, and the block's free is exact.
#[test]
fn cuda_refuses_registering_its_own_pinned_memory_and_pinguard_passes_that_on() {
    let ops = ["cuda_alloc:1048576", "cuda_register_slot:0", "cuda_free:0"];
    let r = run("scenario", &ops, &[("PINGUARD_BUDGET", "1M")]);
    assert!(r.success(), "{}", r.stderr);
    assert_eq!(r.rcs(), vec![0, 712, 0], "{}", r.stdout);
    let s = r.stats();
    assert_eq!(s["cuda"]["alloc_calls"], 1);
    assert_eq!(s["pinguard_live_bytes"], 0);
    let t = r.typed_report().totals;
    assert_eq!(t.failed_count, 1, "{t:?}");
    assert_eq!(t.unknown_release_count, 0, "{t:?}");
    assert_eq!(t.denied_count, 0, "{t:?}");
    assert_eq!(t.peak_live_bytes, MIB_BYTES);
}

/// The driver answers the same (`CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`, 712) for a block it
/// allocated: passed on, nothing counted for it.
#[test]
fn the_driver_refuses_registering_its_own_pinned_memory_and_pinguard_passes_that_on() {
    let r = run(
        "vmm",
        &[
            "export",
            "cuda",
            "host_alloc:1048576",
            "host_register:a0",
            "host_free:a0",
        ],
        &[("PINGUARD_BUDGET", "1M")],
    );
    assert!(r.success(), "{}", r.stderr);
    assert_eq!(r.rcs(), vec![0, 712, 0], "{}", r.stdout);
    let s = r.stats();
    assert_eq!(s["driver"]["alloc_calls"], 1);
    assert_eq!(s["pinguard_live_bytes"], 0);
    let t = r.typed_report().totals;
    assert_eq!(t.failed_count, 1, "{t:?}");
    assert_eq!(t.unknown_release_count, 0, "{t:?}");
    assert_eq!(t.peak_live_bytes, MIB_BYTES);
}
