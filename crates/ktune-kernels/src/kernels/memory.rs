//! Memory advice for large read-mostly buffers: backing them with transparent huge
//! pages ([`huge_vec`] before they are written, [`huge_pages`] after), which the
//! runtime's weights, the races' inputs and the bandwidth measurement ask for.
//! No kernel code: `cpu/` and `quant/` both sit above it.

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
/// turns it off (for A/B measurements). Collapsing costs at load: about 0.5 s
/// more for the 1B model's 800 MB on this VM (pages copied into freshly zeroed
/// huge pages), against ~2.7 ms saved on every decoded token; memory made by
/// [`huge_vec`] and filled after has nothing left to move.
pub fn huge_pages<T>(data: &[T]) {
    mark_huge(data.as_ptr().cast(), std::mem::size_of_val(data), true);
}

/// An empty vector with room for `capacity` elements whose memory is marked for
/// huge pages before anything touches it: filled by the caller, its 2 MiB-aligned
/// interior faults in as huge pages directly (where the system has them free), so
/// the [`huge_pages`] that follows finds nothing to move. A buffer filled first
/// and collapsed after is copied page by page into huge pages: on this 2-core VM
/// that copy was a sixth of a CPU-and-GPU comparison of the built-in models' and
/// up to 3-4 s a GB on a fragmented page cache. Best effort, as [`huge_pages`]:
/// memory the allocator hands back already touched (small buffers from its heap)
/// stays on small pages until collapsed.
pub fn huge_vec<T>(capacity: usize) -> Vec<T> {
    let v: Vec<T> = Vec::with_capacity(capacity);
    mark_huge(v.as_ptr().cast(), v.capacity().saturating_mul(std::mem::size_of::<T>()), false);
    v
}

/// `len` copies of `value` in a [`huge_vec`].
pub fn huge_filled<T: Clone>(len: usize, value: T) -> Vec<T> {
    let mut v = huge_vec(len);
    v.resize(len, value);
    v
}

/// A copy of `src` in a [`huge_vec`].
pub fn huge_copy<T: Clone>(src: &[T]) -> Vec<T> {
    let mut v = huge_vec(src.len());
    v.extend_from_slice(src);
    v
}

/// Until when [`huge_pages`] may collapse (None: always).
static COLLAPSE_UNTIL: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);

/// Lets [`huge_pages`] collapse pages only until `until` (None: no limit). The
/// copy into huge pages costs what the kernel's compaction costs: 0.5 s a GB on a
/// quiet machine, 3-4 s a GB on one with a fragmented page cache (a Gemma 3 1B f32
/// build took 10.8 s, 2.5 s without it), so a tune under a `--budget` bounds it
/// to each stage's share; past it, ranges are only marked `MADV_HUGEPAGE`
/// (khugepaged may collapse them later).
pub fn collapse_until(until: Option<std::time::Instant>) {
    *COLLAPSE_UNTIL.lock().unwrap_or_else(|p| p.into_inner()) = until;
}

/// The address ranges [`huge_pages`] left uncollapsed since the last [`take_uncollapsed`].
static UNCOLLAPSED: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());

/// Bytes of memory left on small pages by a [`collapse_until`] limit since the
/// last call: the union of the ranges, so a buffer advised again (a weight shared
/// by several engines) counts once.
pub fn take_uncollapsed() -> usize {
    union_bytes(std::mem::take(&mut *UNCOLLAPSED.lock().unwrap_or_else(|p| p.into_inner())))
}

/// Bytes covered by the union of half-open `ranges`.
fn union_bytes(mut ranges: Vec<(usize, usize)>) -> usize {
    ranges.sort_unstable();
    let (mut total, mut reach) = (0, 0);
    for (a, b) in ranges {
        let a = a.max(reach);
        if b > a {
            total += b - a;
        }
        reach = reach.max(b);
    }
    total
}

fn may_collapse() -> bool {
    COLLAPSE_UNTIL.lock().unwrap_or_else(|p| p.into_inner()).is_none_or(|t| std::time::Instant::now() < t)
}

/// `MADV_HUGEPAGE` over the 2 MiB-aligned interior of `bytes` bytes at `ptr`,
/// one allocation's memory, then (`collapse`) `MADV_COLLAPSE` 32 MiB at a time
/// while [`collapse_until`] allows.
#[allow(unused_variables)]
fn mark_huge(ptr: *const u8, bytes: usize, collapse: bool) {
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
        }
        if !collapse {
            return;
        }
        const CHUNK: usize = 16 * HUGE;
        let mut at = start;
        while at < end && may_collapse() {
            let n = CHUNK.min(end - at);
            // SAFETY: as above, a sub-range of the same allocation.
            unsafe {
                libc::madvise(at as *mut libc::c_void, n, MADV_COLLAPSE);
            }
            at += n;
        }
        if at < end {
            UNCOLLAPSED.lock().unwrap_or_else(|p| p.into_inner()).push((at, end));
        }
    }
}

/// Sets `data` to zeros and hands the whole pages inside it back to the system
/// (`MADV_DONTNEED`: they read as zeros and take memory again only when written),
/// the partial pages at its ends zeroed in place. A KV cache freed this way
/// holds memory in proportion to the positions written since, so a server's
/// sequences share the machine's memory by what they hold, not by the context
/// each could reach. Elsewhere than Linux every element is written.
pub fn release_zeroed<T: bytemuck::Zeroable + Copy>(data: &mut [T]) {
    let size = std::mem::size_of::<T>().max(1);
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let base = data.as_ptr() as usize;
        let (start, end) = (base.next_multiple_of(PAGE), (base + std::mem::size_of_val(data)) / PAGE * PAGE);
        if end > start && (start - base).is_multiple_of(size) {
            let (head, rest) = data.split_at_mut((start - base) / size);
            let (_, tail) = rest.split_at_mut((end - start) / size);
            head.fill(T::zeroed());
            tail.fill(T::zeroed());
            // SAFETY: the range is whole pages inside `data`, which this call
            // holds mutably; on private anonymous memory (the heap, mmapped
            // allocations) MADV_DONTNEED makes them read back as zeros.
            let done = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) } == 0;
            if done {
                return;
            }
        }
    }
    data.fill(T::zeroed());
}

#[cfg(test)]
mod tests {
    use super::union_bytes;

    /// A range advised again, or overlapping another, counts once.
    #[test]
    fn uncollapsed_bytes_are_the_union_of_the_ranges() {
        assert_eq!(union_bytes(vec![]), 0);
        assert_eq!(union_bytes(vec![(10, 20), (10, 20), (10, 20)]), 10, "one buffer advised by three engines");
        assert_eq!(union_bytes(vec![(15, 30), (10, 20)]), 20, "overlapping");
        assert_eq!(union_bytes(vec![(40, 50), (10, 20), (12, 18)]), 20, "apart, and one inside another");
    }

    #[test]
    fn released_memory_reads_as_zeros_and_can_be_written_again() {
        let mut v: Vec<f32> = (0..100_000).map(|i| i as f32 + 1.0).collect();
        super::release_zeroed(&mut v[3..]);
        assert_eq!(&v[..3], &[1.0, 2.0, 3.0], "outside the slice nothing changes");
        assert!(v[3..].iter().all(|&x| x == 0.0), "every released value reads 0");
        v[50_000] = 7.0;
        assert_eq!(v[50_000], 7.0);
    }
}
