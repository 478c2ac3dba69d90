//! Memory advice for large read-mostly buffers: backing them with transparent huge
//! pages ([`huge_pages`]), which the runtime's weights, the parity checker's inputs
//! and the bandwidth measurement ask for. No kernel code: `cpu/` and `quant/` both
//! sit above it.

use std::sync::OnceLock;

/// Backs the 2 MiB-aligned interior of `data` with transparent huge pages where
/// the system offers them. A decode step streams every weight once: with 4 KiB
/// pages the hardware prefetchers stop at every page boundary and each page costs
/// a TLB walk (Llama 3.2 1B Q4_K_M on the 2-core EPYC: 33.8 -> 37.5 tok/s,
/// `tools/bench_hugepages.sh`). `MADV_HUGEPAGE` marks the range (the usual THP
/// mode is `madvise`, which backs nothing unasked); `MADV_COLLAPSE` (Linux 6.1)
/// moves pages already filled into huge ones now rather than whenever khugepaged
/// scans them. Best effort: where the kernel has neither (or THP is `never`),
/// the pages stay as they are; contents never change. `KTUNE_NO_HUGEPAGES` set
/// turns it off (for A/B measurements). The cost is at load: about 0.5 s more
/// for the 1B model's 800 MB on this VM (pages copied into freshly zeroed huge
/// pages), against ~2.7 ms saved on every decoded token.
pub fn huge_pages<T>(data: &[T]) {
    advise_huge(data.as_ptr().cast(), std::mem::size_of_val(data));
}

/// `MADV_HUGEPAGE` then `MADV_COLLAPSE` over the 2 MiB-aligned interior of
/// `bytes` bytes at `ptr`, one allocation's memory.
#[allow(unused_variables)]
fn advise_huge(ptr: *const u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        /// `MADV_COLLAPSE` of the Linux uapi (libc defines it for glibc targets only).
        const MADV_COLLAPSE: libc::c_int = 25;
        static OFF: OnceLock<bool> = OnceLock::new();
        if *OFF.get_or_init(|| std::env::var_os("KTUNE_NO_HUGEPAGES").is_some()) {
            return;
        }
        let (start, end) = ((ptr as usize).next_multiple_of(HUGE), (ptr as usize).saturating_add(bytes) / HUGE * HUGE);
        if end <= start {
            return;
        }
        // SAFETY: the range lies inside one allocation the caller holds; both
        // advices change only how its pages are backed, never their contents.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            libc::madvise(start as *mut libc::c_void, end - start, MADV_COLLAPSE);
        }
    }
}
