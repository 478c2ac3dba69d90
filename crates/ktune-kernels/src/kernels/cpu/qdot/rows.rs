//! Weight-row access for the CPU block-format kernels ([`qin`], [`qrow`]) and the
//! dequantize-once prefill step: a few weight rows dequantized into L1, dotted
//! with every token ([`rows_times_tokens`]); a few tokens' decode dots
//! ([`rows_times_vectors`]); row blocks run over the pool, each written
//! token-major by its task ([`row_blocks`]), or handed back ([`par_row_blocks`]).

use std::cell::RefCell;

use super::{ActVec, dequantize_row};
use crate::kernels::contract::CpuIn;
use crate::kernels::contract::{KernelError, Params};
use crate::kernels::cpu::dot::dot_f32;
use crate::kernels::cpu::qx8::rows_x8_tokens;
use crate::kernels::cpu::{Isa, pool, with_scratch};
use crate::kernels::quant::{Layout, QFormat, QView};

pub fn qin<'a>(k: &str, a: &CpuIn<'a>) -> Result<QView<'a>, KernelError> {
    a.quant().ok_or_else(|| KernelError::BufferType { kernel: k.into(), buffer: "w".into(), expected: "a quantized matrix" })
}

/// Row `r` of a `[_, k]` quantized matrix.
#[inline]
pub fn qrow<'a>(w: QView<'a>, r: usize, k: usize) -> QView<'a> {
    let bpr = k / w.format.block_elems();
    w.blocks_range(r * bpr, bpr)
}

thread_local! {
    /// Dequantized weight rows of one pool task.
    static ROWS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `y[t, r]` for rows `r0..r0 + count` of `w` and every token: each row dequantized
/// once into L1, then dotted with the tokens `tile` at a time, into `out`
/// token-major (`[m][count]`).
#[allow(clippy::too_many_arguments)]
pub fn rows_times_tokens(isa: Isa, x: &[f32], m: usize, k: usize, w: QView<'_>, r0: usize, count: usize, tile: usize, out: &mut [f32]) {
    with_scratch(&ROWS, count * k, |buf| {
        for i in 0..count {
            dequantize_row(isa, w, r0 + i, k, &mut buf[i * k..(i + 1) * k]);
        }
        for t0 in (0..m).step_by(tile.max(1)) {
            for i in 0..count {
                let wr = &buf[i * k..(i + 1) * k];
                for t in t0..(t0 + tile).min(m) {
                    out[t * count + i] = dot_f32(isa, &x[t * k..(t + 1) * k], wr);
                }
            }
        }
    });
}

/// The activation vectors of `m` tokens of `k` (`x`, token-major) as the decode's
/// GEMV takes one ([`ActVec::new`]: int8 blocks with `act_bits` 8).
pub fn token_vectors<'a>(x: &'a [f32], m: usize, k: usize, params: &Params, format: QFormat) -> Result<Vec<ActVec<'a>>, KernelError> {
    x[..m * k].chunks_exact(k).map(|xt| ActVec::new(xt, params, format)).collect()
}

/// `y[t, r]` for rows `r0..r0 + count` of `w` and the vectors `xs` of every
/// token, each dot as the decode's GEMV computes it ([`ActVec::rows`]), so a
/// token among others gets the values it gets alone. Eight rows at a time go
/// through every token: read from memory for the first, from L1 for the rest;
/// over [`Layout::X8`] records with int8 activations, decoded once for a few
/// tokens at a time ([`rows_x8_tokens`]). Into `out` token-major (`[m][count]`).
#[allow(clippy::too_many_arguments)]
pub fn rows_times_vectors(isa: Isa, xs: &[ActVec<'_>], w: QView<'_>, k: usize, r0: usize, count: usize, four: bool, out: &mut [f32]) {
    const RUN: usize = 8;
    if let Layout::X8 { .. } = w.layout {
        let int8 = |t: usize| if let ActVec::I8(q) = &xs[t] { Some(q) } else { None };
        if (0..xs.len()).all(|t| int8(t).is_some()) {
            return rows_x8_tokens(isa, xs.len(), |t| int8(t).expect("int8 activations (checked)"), w, r0, count, out);
        }
    }
    let mut y = [0f32; RUN];
    for c in (0..count).step_by(RUN) {
        let y = &mut y[..RUN.min(count - c)];
        for (t, x) in xs.iter().enumerate() {
            x.rows(isa, w, k, r0 + c, y, four);
            out[t * count + c..][..y.len()].copy_from_slice(y);
        }
    }
}

/// Runs `f(r0, count)` for blocks of `grain` weight rows of `n` in parallel; each
/// returns its rows' outputs for every token, handed back in order.
pub fn par_row_blocks(n: usize, grain: usize, f: impl Fn(usize, usize) -> Vec<f32> + Sync + Send) -> Vec<(usize, usize, Vec<f32>)> {
    let mut parts: Vec<(usize, usize, Vec<f32>)> =
        (0..n.div_ceil(grain)).map(|c| (c * grain, grain.min(n - c * grain), Vec::new())).collect();
    pool::for_chunks_mut(&mut parts, 1, |_, p| p[0].2 = f(p[0].0, p[0].1));
    parts
}

thread_local! {
    /// One pool task's block of outputs (`[m][count]`) in [`row_blocks`].
    static BLOCK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The token-major `y[m, n]` shared by the tasks of [`row_blocks`], each of
/// which writes its own columns.
#[derive(Clone, Copy)]
struct Columns(*mut f32);
// SAFETY: the tasks of one `row_blocks` call write disjoint columns of `y`,
// which is exclusively borrowed for the call and outlives it.
unsafe impl Send for Columns {}
// SAFETY: as above.
unsafe impl Sync for Columns {}
impl Columns {
    /// The start of `y` (a method: a closure then captures the whole `Columns`).
    fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// `y[m, n]` (token-major) in one pool run over blocks of `grain` weight rows:
/// `f(r0, count, block)` writes rows `r0..r0 + count` against every token into
/// `block` (token-major, `[m][count]`, zeroed, a scratch of the task's thread),
/// whose token rows the same task copies into its columns of `y`. No block is
/// allocated or kept, and no second run gathers them (a decode batch's GEMM is
/// a few microseconds of arithmetic a task, which a second synchronisation, an
/// allocation and a strided transpose a task took a fifth of).
pub fn row_blocks(y: &mut [f32], m: usize, n: usize, grain: usize, f: impl Fn(usize, usize, &mut [f32]) + Sync) {
    let grain = grain.max(1);
    let y = &mut y[..m * n];
    let cols = Columns(y.as_mut_ptr());
    // Runs of consecutive row blocks a thread: a task's kept panel fetches the
    // next block's, which the same thread then computes.
    pool::for_each_run(n.div_ceil(grain), |c| {
        let (r0, count) = (c * grain, grain.min(n - c * grain));
        with_scratch(&BLOCK, count * m, |block| {
            block.fill(0.0);
            f(r0, count, block);
            for (t, from) in block.chunks_exact(count).enumerate() {
                // SAFETY: `t * n + r0 + count <= m * n`, the length of `y`; the
                // columns `r0..r0 + count` are this task's alone (the tasks' row
                // blocks do not overlap), so no two tasks write one element.
                let row = unsafe { std::slice::from_raw_parts_mut(cols.ptr().add(t * n + r0), count) };
                row.copy_from_slice(from);
            }
        });
    });
}
