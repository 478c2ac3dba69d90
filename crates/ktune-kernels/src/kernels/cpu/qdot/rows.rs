//! Weight-row access for the CPU block-format kernels ([`qin`], [`qrow`]) and the
//! dequantize-once prefill step: a few weight rows dequantized into L1, dotted
//! with every token ([`rows_times_tokens`]); a few tokens' decode dots
//! ([`rows_times_vectors`]); row blocks run over the pool and
//! scattered back token-major ([`par_row_blocks`], [`scatter_row_blocks`]).

use std::cell::RefCell;

use super::{ActVec, dequantize_row};
use crate::kernels::contract::CpuIn;
use crate::kernels::contract::{KernelError, Params};
use crate::kernels::cpu::dot::dot_f32;
use crate::kernels::cpu::{Isa, pool, with_scratch};
use crate::kernels::quant::{QFormat, QView};

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
/// once into L1, then dotted with the tokens `tile` at a time. Returns `[count][m]`.
#[allow(clippy::too_many_arguments)]
pub fn rows_times_tokens(isa: Isa, x: &[f32], m: usize, k: usize, w: QView<'_>, r0: usize, count: usize, tile: usize) -> Vec<f32> {
    let mut out = vec![0f32; count * m];
    with_scratch(&ROWS, count * k, |buf| {
        for i in 0..count {
            dequantize_row(isa, w, r0 + i, k, &mut buf[i * k..(i + 1) * k]);
        }
        for t0 in (0..m).step_by(tile.max(1)) {
            for i in 0..count {
                let wr = &buf[i * k..(i + 1) * k];
                for t in t0..(t0 + tile).min(m) {
                    out[i * m + t] = dot_f32(isa, &x[t * k..(t + 1) * k], wr);
                }
            }
        }
    });
    out
}

/// The activation vectors of `m` tokens of `k` (`x`, token-major) as the decode's
/// GEMV takes one ([`ActVec::new`]: int8 blocks with `act_bits` 8).
pub fn token_vectors<'a>(x: &'a [f32], m: usize, k: usize, params: &Params, format: QFormat) -> Result<Vec<ActVec<'a>>, KernelError> {
    x[..m * k].chunks_exact(k).map(|xt| ActVec::new(xt, params, format)).collect()
}

/// `y[t, r]` for rows `r0..r0 + count` of `w` and the vectors `xs` of every
/// token, each dot as the decode's GEMV computes it ([`ActVec::rows`]), so a
/// token among others gets the values it gets alone. Eight rows at a time go
/// through every token: read from memory for the first, from L1 for the rest.
/// Returns `[count][m]`.
pub fn rows_times_vectors(isa: Isa, xs: &[ActVec<'_>], w: QView<'_>, k: usize, r0: usize, count: usize, four: bool) -> Vec<f32> {
    const RUN: usize = 8;
    let m = xs.len();
    let mut out = vec![0f32; count * m];
    let mut y = [0f32; RUN];
    for c in (0..count).step_by(RUN) {
        let y = &mut y[..RUN.min(count - c)];
        for (t, x) in xs.iter().enumerate() {
            x.rows(isa, w, k, r0 + c, y, four);
            for (i, &v) in y.iter().enumerate() {
                out[(c + i) * m + t] = v;
            }
        }
    }
    out
}

/// Runs `f(r0, count)` for blocks of `grain` weight rows of `n` in parallel; each
/// returns its rows' outputs for every token as `[count][m]`.
pub fn par_row_blocks(n: usize, grain: usize, f: impl Fn(usize, usize) -> Vec<f32> + Sync + Send) -> Vec<(usize, usize, Vec<f32>)> {
    let mut parts: Vec<(usize, usize, Vec<f32>)> =
        (0..n.div_ceil(grain)).map(|c| (c * grain, grain.min(n - c * grain), Vec::new())).collect();
    pool::for_chunks_mut(&mut parts, 1, |_, p| p[0].2 = f(p[0].0, p[0].1));
    parts
}

/// Writes the `[count][m]` row blocks of [`par_row_blocks`] into the token-major
/// `y[m, n]`, one token row per pool task (each gathers its column of every
/// block; serially this transpose was 6% of a 1B-shaped Q8_0 prefill).
pub fn scatter_row_blocks(parts: Vec<(usize, usize, Vec<f32>)>, m: usize, n: usize, y: &mut [f32]) {
    pool::for_chunks_mut(&mut y[..m * n], n, |t, row| {
        for (r0, count, part) in &parts {
            for (i, o) in row[*r0..*r0 + *count].iter_mut().enumerate() {
                *o = part[i * m + t];
            }
        }
    });
}
