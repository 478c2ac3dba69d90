//! The one CPU layer every CPU kernel is written against: the instruction-set level
//! ([`Isa`], detected once per process), the `isa` and `threads` parameters and their
//! validity checks, the pool orchestrators that split rows or elements over the
//! pool, weight-row views, and the single-threaded SIMD microkernels: the lane-width
//! abstraction ([`lanes`]), f32/f16 dot products and axpy ([`dot`]), the block
//! (quantized) dot products ([`qdot`]) and those over X8 records ([`qx8`]); the
//! int8 prefill GEMM ([`qgemm`]) and the blocked f32 GEMM engine ([`sgemm`]). Each
//! of them keeps its x86 intrinsics in an `x86.rs` or `x86/` beside it (as ggml-cpu
//! keeps `arch/x86/`).
//!
//! Kernels expose the instruction set as the `isa` parameter so the tuner can compare
//! levels (`0` = best available, `2` = AVX2+FMA / NEON, `1` = portable scalar).

pub mod dot;
pub mod lanes;
pub mod pool;
pub mod qdot;
pub mod qgemm;
pub mod qx8;
pub mod sgemm;
#[cfg(test)]
pub(crate) mod testdata;

use std::cell::RefCell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::LocalKey;

pub use dot::{
    Elems, Q8_BLOCK, Q8Row, Row, add_sumsq, axpy, axpy_row, dot, dot_f16, dot_f32, dot_rows, dot2x4, dot4, dot4_f16, dot4_f32, scale_mul,
    weighted_rows, weighted_rows_add, weighted_rows_heads, widen_row,
};
pub(crate) use lanes::isa_dispatch;
pub use lanes::{Elem, Lanes};
pub use qdot::{
    ACT_BITS, ActVec, DOT_ROWS_PARAMS, ROWS_PER_PASS, XQ8, check_quant, dequantize, dequantize_row, dot_q, dot_q_i8, par_row_blocks, qin,
    qrow, row_blocks, rows_times_tokens, rows_times_vectors, token_vectors,
};

use super::contract::{CpuIn, KernelError, ParamSpec, Params, param};
use super::problem::Problem;
use super::quant::DType;
use crate::device::CpuCaps;

/// What this CPU offers the microkernels, probed once per process.
#[derive(Clone, Copy, Debug)]
pub struct Features {
    pub avx512f: bool,
    /// AVX-512 VNNI with BW and VL (and AVX2): `vpdpbusd` on 256-bit registers.
    pub vnni: bool,
    /// AVX2 + FMA + F16C, the 256-bit x86 level.
    pub avx2: bool,
    /// Lists AMX-TILE and AMX-INT8 (whether or not the system grants their
    /// state, [`qgemm::amx_granted`]): a Sapphire Rapids-class Xeon core, which
    /// also runs 512-bit integer multiplies on two ports at full width.
    pub amx_int8: bool,
    pub neon: bool,
}

/// The instruction-set features of this CPU (the only detection in the kernel set).
pub fn features() -> Features {
    static F: OnceLock<Features> = OnceLock::new();
    *F.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            let vnni = avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni");
            // CPUID leaf 7 (EDX bits 24, 25), read where the CPU has it
            // (`is_x86_feature_detected!`'s AMX names are unstable).
            use std::arch::x86_64::{__cpuid_count, __get_cpuid_max};
            let amx_int8 = __get_cpuid_max(0).0 >= 7 && {
                let l7 = __cpuid_count(7, 0);
                l7.edx & (1 << 24) != 0 && l7.edx & (1 << 25) != 0
            };
            Features { avx512f: has!("avx512f"), vnni, avx2, amx_int8, neon: false }
        }
        #[cfg(target_arch = "aarch64")]
        {
            Features { avx512f: false, vnni: false, avx2: false, amx_int8: false, neon: std::arch::is_aarch64_feature_detected!("neon") }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            Features { avx512f: false, vnni: false, avx2: false, amx_int8: false, neon: false }
        }
    })
}

/// Instruction-set level of a microkernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA (+ F16C for f16 rows) on x86, NEON on aarch64.
    Simd256,
    /// AVX-512F on x86.
    Avx512,
}

impl Isa {
    /// The widest level this CPU supports.
    pub fn best() -> Isa {
        let f = features();
        if f.avx512f {
            Isa::Avx512
        } else if f.avx2 || f.neon {
            Isa::Simd256
        } else {
            Isa::Scalar
        }
    }

    /// From the `isa` kernel parameter: 0 best, 1 scalar, 2 AVX2/NEON; never above `best()`.
    pub fn from_param(v: u32) -> Isa {
        let best = Isa::best();
        let want = match v {
            1 => Isa::Scalar,
            2 => Isa::Simd256,
            _ => best,
        };
        if want as u8 > best as u8 { best } else { want }
    }

    /// The level the variant's `isa` parameter asks for.
    pub fn of(params: &Params) -> Result<Isa, KernelError> {
        Ok(Isa::from_param(param(params, "isa")?))
    }

    /// Whether the `isa` parameter value is available on this CPU (for validity checks).
    pub fn param_available(v: u32) -> Result<(), String> {
        match v {
            2 if Isa::best() == Isa::Scalar => Err("isa=2 needs AVX2+FMA+F16C or NEON".into()),
            _ => Ok(()),
        }
    }

    /// Whether the 256-bit x86 path (AVX2+FMA+F16C) may run at this level.
    #[inline]
    pub fn avx2(self) -> bool {
        self != Isa::Scalar && features().avx2
    }

    /// AVX-512 VNNI integer dots (the best level on a CPU that has them; `isa 2`
    /// keeps the AVX2 ones).
    pub fn vnni(self) -> bool {
        self == Isa::Avx512 && features().vnni
    }
}

/// How far ahead of the block being read (bytes) the int8 decode dots prefetch
/// a weight row's quants when nothing sets it: across the end of a row into the
/// next one, which the same task reads next (measured on a Zen 4 EPYC: 1B-shaped
/// Q4_K_M decode 24 -> 28 tok/s against no prefetch).
pub const DEFAULT_PREFETCH: u32 = 2048;
/// The largest prefetch distance a profile may set.
pub const MAX_PREFETCH: u32 = 1 << 16;

static PREFETCH: AtomicUsize = AtomicUsize::new(DEFAULT_PREFETCH as usize);

/// The int8 decode dots' prefetch distance in bytes (0: none).
#[inline]
pub fn prefetch_bytes() -> usize {
    PREFETCH.load(Ordering::Relaxed)
}

/// Prefetches `len` bytes (whole 64-byte lines, the last one partly) starting
/// `ahead` bytes past `p`, into every cache level (none when `ahead` is 0): a
/// decode dot's rows `prefetch_bytes()` ahead of the one it reads. The address may
/// lie past the end of the row or of the allocation: a prefetch never faults.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "sse")]
pub(crate) fn prefetch_ahead(p: *const u8, ahead: usize, len: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    if ahead == 0 {
        return;
    }
    let p = p.wrapping_add(ahead);
    let mut o = 0;
    while o < len {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o) as *const i8);
        o += 64;
    }
}

/// Sets the prefetch distance of every later decode dot in this process (the
/// runtime sets an engine's, the profile's `execution.cpuPrefetchBytes`, before
/// each pass); clamped to [`MAX_PREFETCH`].
pub fn set_prefetch_bytes(bytes: u32) {
    PREFETCH.store(bytes.min(MAX_PREFETCH) as usize, Ordering::Relaxed);
}

/// The `isa` parameter values and help, shared by every CPU kernel.
pub const ISA_VALUES: &[u32] = &[0, 1, 2];
pub const ISA_HELP: &str = "instruction set: 0 best available (AVX-512 > AVX2 > NEON), 1 scalar, 2 AVX2+FMA or NEON";
/// The `isa` parameter.
pub const ISA: ParamSpec = ParamSpec { name: "isa", values: ISA_VALUES, default: 0, help: ISA_HELP };

/// The `threads` parameter of the static-range kernels.
pub const THREADS: ParamSpec = ParamSpec::new(
    "threads",
    &[0, 1, 2, 4, 8, 16],
    0,
    "contiguous static ranges, one per thread: 0 all of the pool.s threads, 1 single-threaded",
);

/// `rows_per_task` over the weight rows of a matrix-vector kernel.
pub const ROWS_PER_TASK: ParamSpec =
    ParamSpec { name: "rows_per_task", values: &[8, 16, 32, 64, 128, 256], default: 64, help: "weight rows per pool task" };

/// `strategy` of [`par_rows`] without the single-threaded choice.
pub const STRATEGY: ParamSpec =
    ParamSpec::new("strategy", &[0, 1], 0, "0 dynamic work stealing by rows_per_task, 1 one static row range per thread");

/// Row-wise kernels under [`par_rows`] (norms, softmax).
pub const ROWS_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "rows_per_task", values: &[1, 2, 4, 8, 16, 32], default: 4, help: "rows per pool task (dynamic strategy)" },
    ParamSpec {
        name: "strategy",
        values: &[0, 1, 2],
        default: 0,
        help: "0 dynamic work stealing by rows_per_task, 1 one static row range per thread, 2 single-threaded",
    },
    ISA,
];

/// Row-wise kernels that split one row's features over tasks (decode).
pub const SPLIT_PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "chunk",
        values: &[256, 512, 1024, 2048, 4096, 8192],
        default: 1024,
        help: "features per pool task within one row (decode: one long row split over threads)",
    },
    ISA,
];

/// CPU kernels whose only rule is the `isa` level.
pub fn check_isa(_: &CpuCaps, _: &Problem, _: DType, params: &Params) -> Result<(), String> {
    Isa::param_available(param(params, "isa")?)
}

/// CPU kernels with a `threads` parameter: no more threads than the process has.
pub fn check_threads(caps: &CpuCaps, _: &Problem, _: DType, params: &Params) -> Result<(), String> {
    let t = param(params, "threads")? as usize;
    if t > caps.threads.max(1) {
        return Err(format!("threads = {t} exceeds the {} threads this process may use", caps.threads));
    }
    Ok(())
}

/// How [`par_rows`] splits rows over the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowSplit {
    /// Dynamic work stealing, this many rows per task.
    Dynamic(usize),
    /// One static range per thread.
    PerThread,
    /// All rows on the calling thread.
    Caller,
}

impl RowSplit {
    /// From the `strategy` (0 dynamic, 1 per thread, 2 calling thread) and
    /// `rows_per_task` parameters.
    pub fn of(params: &Params) -> Result<RowSplit, KernelError> {
        Ok(match param(params, "strategy")? {
            2 => RowSplit::Caller,
            1 => RowSplit::PerThread,
            _ => RowSplit::dynamic(params)?,
        })
    }

    /// Dynamic by `rows_per_task`, for kernels without a `strategy` parameter.
    pub fn dynamic(params: &Params) -> Result<RowSplit, KernelError> {
        Ok(RowSplit::Dynamic((param(params, "rows_per_task")? as usize).max(1)))
    }
}

/// Splits `y` (`rows` rows of `dim`) into row ranges as `split` says and runs
/// `f(first_row, rows_chunk)` on each.
pub fn par_rows(y: &mut [f32], dim: usize, split: RowSplit, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    let rows = y.len().checked_div(dim).unwrap_or(0);
    if rows == 0 {
        return;
    }
    let y = &mut y[..rows * dim];
    let grain = match split {
        RowSplit::Caller => {
            f(0, y);
            return;
        }
        RowSplit::PerThread => rows.div_ceil(pool::pool().threads()).max(1),
        RowSplit::Dynamic(g) => g.max(1),
    };
    pool::for_chunks_mut(y, grain * dim, |i, chunk| f(i * grain, chunk));
}

/// Splits a flat `y` into chunks of `grain` elements run in parallel (`f(first, chunk)`);
/// a problem no larger than one chunk runs on the calling thread.
pub fn par_elems(y: &mut [f32], grain: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    let grain = grain.max(1);
    if y.len() <= grain {
        f(0, y);
        return;
    }
    pool::for_chunks_mut(y, grain, |i, chunk| f(i * grain, chunk));
}

/// Splits a flat `y` into `threads` contiguous ranges (0: the pool's threads).
pub fn static_ranges(y: &mut [f32], threads: u32, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    let t = if threads == 0 { pool::pool().threads() } else { threads as usize }.max(1);
    if t == 1 || y.len() < 2 {
        f(0, y);
        return;
    }
    let grain = y.len().div_ceil(t).max(1);
    pool::for_chunks_mut(y, grain, |i, chunk| f(i * grain, chunk));
}

/// Row `r` of a row-major `[_, k]` float weight.
#[inline]
pub fn row(w: CpuIn<'_>, r: usize, k: usize) -> Row<'_> {
    sub_row(w, r, k, 0, k)
}

/// Columns `c0..c1` of row `r` of a row-major `[_, k]` float weight.
#[inline]
pub fn sub_row(w: CpuIn<'_>, r: usize, k: usize, c0: usize, c1: usize) -> Row<'_> {
    match w {
        CpuIn::F32(s) => Row::F32(&s[r * k + c0..r * k + c1]),
        CpuIn::F16(s) => Row::F16(&s[r * k + c0..r * k + c1]),
        // A q8_0 KV cache in rows of whole blocks (`k` and `c0` multiples of 32:
        // the attention kernels' checks).
        CpuIn::Q(q) if q.format == crate::kernels::quant::QFormat::Q8_0 && q.layout == crate::kernels::quant::Layout::Rows => {
            Row::Q8(Q8Row { q: bytemuck::cast_slice(q.quants), d: q.scales }.slice(r * k + c0, r * k + c1))
        }
        // Float kernels never get another quantized buffer: the registry checks dtypes.
        CpuIn::Q(_) | CpuIn::Stack(_) => Row::F32(&[]),
    }
}

/// Runs `f` on the per-thread scratch buffer `key` grown to `len` floats (a fresh
/// buffer when the key is already borrowed by a caller up the stack).
pub fn with_scratch<R>(key: &'static LocalKey<RefCell<Vec<f32>>>, len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    with_scratch_cap(key, len, len, f)
}

/// [`with_scratch`] that reserves room for `cap` floats the first time, so a
/// buffer that grows with the sequence (a score row) is allocated once.
pub fn with_scratch_cap<R>(key: &'static LocalKey<RefCell<Vec<f32>>>, len: usize, cap: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => {
            if v.capacity() < cap.max(len) {
                let more = cap.max(len) - v.len();
                v.reserve_exact(more);
            }
            if v.len() < len {
                v.resize(len, 0.0);
            }
            f(&mut v[..len])
        }
        Err(_) => f(&mut vec![0.0; len]),
    })
}

/// Buffers given back by dropped temporaries ([`Scratch`], the int8 activation
/// blocks), shared by every thread: a pool worker that runs a kernel for the
/// first time takes a buffer another thread gave back instead of allocating,
/// so whether a decode step allocates never depends on which worker ran what.
/// [`reserve_spares`] fills them up front for a model's sizes.
pub struct Spares<T> {
    list: std::sync::Mutex<Vec<T>>,
}

/// At most this many buffers are kept per kind (more are freed).
const SPARES_KEPT: usize = 256;

impl<T> Spares<T> {
    pub const fn new() -> Spares<T> {
        Spares { list: std::sync::Mutex::new(Vec::new()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<T>> {
        self.list.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The smallest kept buffer that `fits` (sizes by `size`), else the largest
    /// (the caller grows it): a small request never takes the buffer a large
    /// one needs ([`take_fitting`]).
    pub fn take(&self, fits: impl Fn(&T) -> bool, size: impl Fn(&T) -> usize) -> Option<T> {
        take_fitting(&mut self.lock(), fits, size)
    }

    /// Keeps `v` for the next [`Spares::take`].
    pub fn give(&self, v: T) {
        keep_within(&mut self.lock(), v, SPARES_KEPT);
    }

    /// Makes sure `count` kept buffers `fit`, adding `make()`s.
    pub fn ensure(&self, count: usize, fits: impl Fn(&T) -> bool, make: impl Fn() -> T) {
        let mut l = self.lock();
        let have = l.iter().filter(|v| fits(v)).count();
        for _ in have..count.min(SPARES_KEPT) {
            if l.len() >= SPARES_KEPT {
                let small = l.iter().position(|v| !fits(v));
                match small {
                    Some(i) => drop(l.swap_remove(i)),
                    None => break,
                }
            }
            l.push(make());
        }
    }
}

/// Removes and returns the smallest of `list` that `fits` (sizes by `size`),
/// else the largest: the rule of [`Spares`] and of a thread's own kept buffers
/// ([`take_local`]).
pub fn take_fitting<T>(list: &mut Vec<T>, fits: impl Fn(&T) -> bool, size: impl Fn(&T) -> usize) -> Option<T> {
    let fitting = list.iter().enumerate().filter(|(_, v)| fits(v)).min_by_key(|(_, v)| size(v)).map(|(i, _)| i);
    let i = fitting.or_else(|| list.iter().enumerate().max_by_key(|(_, v)| size(v)).map(|(i, _)| i))?;
    Some(list.swap_remove(i))
}

/// Keeps `v` in `list` unless it holds `most` already (then `v` is freed).
fn keep_within<T>(list: &mut Vec<T>, v: T, most: usize) {
    if list.len() < most {
        list.push(v);
    }
}

/// [`take_fitting`] from this thread's own list `key` (no lock: buffers one
/// thread makes and drops, as an int8 GEMM's activation panel); None when
/// the list is empty, borrowed or gone (the thread ending).
pub fn take_local<T: 'static>(key: &'static LocalKey<RefCell<Vec<T>>>, fits: impl Fn(&T) -> bool, size: impl Fn(&T) -> usize) -> Option<T> {
    key.try_with(|l| l.try_borrow_mut().ok().and_then(|mut l| take_fitting(&mut l, fits, size))).ok().flatten()
}

/// Keeps `v` in this thread's list `key` for [`take_local`], at most `most`.
pub fn give_local<T: 'static>(key: &'static LocalKey<RefCell<Vec<T>>>, v: T, most: usize) {
    let _ = key.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            keep_within(&mut l, v, most);
        }
    });
}

impl<T> Default for Spares<T> {
    fn default() -> Spares<T> {
        Spares::new()
    }
}

/// Spare vectors for [`Scratch`].
static SPARE: Spares<Vec<f32>> = Spares::new();

/// Live temporaries one thread can hold at once (a norm's gains, a normalized
/// activation, a RoPE table, inside a kernel run by a parallel group).
const LIVE_PER_THREAD: usize = 4;

/// Fills the shared spares for kernels whose vectors are at most `floats` long
/// on `threads` threads (the runtime calls it when it builds an engine), so
/// the first decode steps on every worker find their buffers ready.
pub fn reserve_spares(threads: usize, floats: usize) {
    let n = threads.max(1) * LIVE_PER_THREAD;
    SPARE.ensure(n, |v| v.capacity() >= floats, || Vec::with_capacity(floats));
    qdot::reserve_spares(threads.max(1) * 2, floats);
}

/// A per-call f32 vector (a norm's widened gains, a normalized activation) taken
/// from the shared spares and given back when dropped: after the first calls
/// (or [`reserve_spares`]) a kernel's temporaries cost no allocation.
pub struct Scratch(Vec<f32>);

impl Scratch {
    /// `len` zeros.
    pub fn zeroed(len: usize) -> Scratch {
        let mut v = SPARE.take(|v| v.capacity() >= len, Vec::capacity).unwrap_or_default();
        v.clear();
        v.resize(len, 0.0);
        Scratch(v)
    }

    /// `f(i)` for `i in 0..len`.
    pub fn from_fn(len: usize, f: impl Fn(usize) -> f32) -> Scratch {
        let mut s = Scratch::zeroed(len);
        s.iter_mut().enumerate().for_each(|(i, v)| *v = f(i));
        s
    }
}

impl std::ops::Deref for Scratch {
    type Target = Vec<f32>;
    fn deref(&self) -> &Vec<f32> {
        &self.0
    }
}

impl std::ops::DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut Vec<f32> {
        &mut self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.0);
        if v.capacity() > 0 {
            SPARE.give(v);
        }
    }
}

/// Merges two online softmax partials `(max, sum of exp(x - max))`.
#[inline]
pub fn merge_stats(a: (f32, f32), b: (f32, f32)) -> (f32, f32) {
    let m = a.0.max(b.0);
    let s = a.1 * (a.0 - m).exp() + b.1 * (b.0 - m).exp();
    (m, s)
}

/// The gated activation in f32 (`silu` or tanh-approximated `gelu`) as the fused
/// projection kernels compute it.
#[inline]
pub fn act_f32(act: super::problem::Activation, g: f32) -> f32 {
    match act {
        super::problem::Activation::Silu => g / (1.0 + (-g).exp()),
        super::problem::Activation::GeluTanh => 0.5 * g * (1.0 + (0.797_884_6 * (g + 0.044715 * g * g * g)).tanh()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn par_rows_visits_every_row_once_under_each_strategy() {
        for strategy in [0, 1, 2] {
            let params: Params = [("strategy".to_string(), strategy), ("rows_per_task".to_string(), 3)].into();
            let mut y = vec![0f32; 7 * 5];
            par_rows(&mut y, 5, RowSplit::of(&params).unwrap(), |first, chunk| {
                for (r, row) in chunk.chunks_mut(5).enumerate() {
                    row.fill((first + r) as f32);
                }
            });
            for (r, row) in y.chunks(5).enumerate() {
                assert!(row.iter().all(|&v| v == r as f32), "strategy {strategy} row {r}");
            }
        }
    }

    #[test]
    fn a_missing_orchestration_parameter_is_an_error() {
        let params: Params = [("strategy".to_string(), 0)].into();
        let err = RowSplit::of(&params).unwrap_err();
        assert!(err.to_string().contains("rows_per_task"), "{err}");
    }
}
