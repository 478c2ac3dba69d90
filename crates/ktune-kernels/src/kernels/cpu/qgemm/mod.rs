//! The int8 GEMM of the CPU layer (prefill on block-format weights): activations
//! quantized once per token to int8 blocks of 32 (as the decode kernels'
//! [`XQ8`](super::XQ8)), weight rows unpacked once per pool task into one row-interleaved
//! layout whatever their format, then AVX-512 VNNI `vpdpbusd` with each of the
//! 16 lanes a different weight row (llama.cpp's repacked CPU layout, here built
//! per task instead of kept beside the weights).
//!
//! The layout ([`Panel`]): a weight's value is `scale * u + off` with `u` an
//! unsigned byte and one scale and offset per row and *scale group* (32 elements
//! where the format's scales span 32, else 16: Q2_K, Q3_K, Q6_K). Rows go in
//! blocks of 16; for each scale group, each run of 4 elements of the 16 rows is
//! one 64-byte vector. A `vpdpbusd` of that vector with 4 activation bytes
//! broadcast adds 4 products into each row's lane, so a scale group's integer
//! dot products accumulate in registers with no per-block conversion; then one
//! conversion and two FMAs per group and token apply `scale · d` and
//! `off · d · Σq`. Values come from the formats' bytes directly for Q4_0, Q4_1,
//! Q4_K and Q8_0 (nibbles as they are with offsets -8d, m or -dmin·m; Q8_0 codes
//! plus 128 with -128d), else from [`Unpacked`] (`v + 128`, offset `off - 128 ·
//! scale`). Packing reads each of a block's 16 rows front to back into staging
//! rows, then transposes 32 elements of the 16 rows at a time (a 16 x 8 dword
//! transpose in AVX-512 registers).
//!
//! Where the CPU has AMX-INT8 and the system grants its tile state, `amx` 1
//! takes each scale group's integer sums of 16 rows by 16 tokens in one tile
//! multiply over the same panel (`x86/amx.rs`; its runs are already the layout
//! AMX reads) and applies the same float steps in the same order: the same
//! bits, fewer instructions where the groups are long (the tuner races it).

use std::cell::RefCell;

use super::qdot::{check_quant, quantize_row, unpack_fast};
use super::{Isa, features};
use crate::device::CpuCaps;
use crate::kernels::contract::{KernelError, ParamSpec, Params, param};
use crate::kernels::problem::Problem;
use crate::kernels::quant::DType;
use crate::kernels::quant::block::Stage;
use crate::kernels::quant::{
    GROUP, Layout, QFormat, QK, QK_K, QView, Unpacked, X8_BYTES, X8_ROWS, scales_mins_k4, x8_row_codes, x8_scale_min,
};

/// The parameters of the int8 GEMM kernels (`gemm_q_i8_cpu`, `gate_up_q_i8_cpu`).
pub const I8_GEMM_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "rows_per_task", values: &[16, 32, 64, 128], default: 32, help: "weight rows unpacked per pool task" },
    ParamSpec {
        name: "act_bits",
        values: &[8],
        default: 8,
        help: "activations as int8 blocks of 32 (llama.cpp's q8 activations: about 0.5% error)",
    },
    ParamSpec {
        name: "isa",
        values: &[0, 1],
        default: 0,
        help: "0 AVX-512 VNNI (invalid on a CPU without it), 1 portable loops of the same arithmetic",
    },
    ParamSpec {
        name: "amx",
        values: &[0, 1, 2],
        default: 0,
        help: "AMX tile multiplies take the VNNI tiles' integer sums (the same bits; 1 and 2 invalid where the CPU lacks AMX or \
               the system does not grant its state): 1 every panel's, 2 where they measured faster (kept nibble panels \
               without a bias, Q4_K's and Q4_1's, of rows of 2048 or more, from 14 tokens; the runtime's default where AMX runs), 0 the VNNI tiles",
    },
];

/// The int8 GEMM kernels: VNNI at `isa` 0 only (AVX2's `maddubs` would saturate
/// on unsigned bytes up to 255; the f32 panel kernels serve those CPUs).
pub fn check_i8_gemm(caps: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    check_quant(caps, prob, dtype, params)?;
    let isa = param(params, "isa")?;
    if isa == 0 && !i8_gemm_simd(Isa::best()) {
        return Err("isa 0 needs AVX-512 VNNI, which this CPU lacks (the f32 panel kernels serve it)".into());
    }
    let amx = param(params, "amx")?;
    if amx != 0 {
        if isa != 0 {
            return Err(format!("amx {amx} needs isa 0 (the portable loops have no tiles)"));
        }
        if !amx_granted() {
            return Err(format!(
                "amx {amx} needs AMX-INT8 and its tile state, which this CPU lacks or its system does not grant (amx 0: the VNNI tiles)"
            ));
        }
    }
    Ok(())
}

/// The fewest tokens for which [`Amx::WherePaying`] takes the AMX tiles. On
/// the 2-core Xeon of stops 77–80 (family 6 model 207; `batch_gemm q4_k q4_1
/// --shape 1b --tokens 8,16,64 --rounds 5`, two runs, ms a step, VNNI against
/// AMX in the same rounds): Q4_K at 16 tokens 29.4, 31.3 against 25.4, 28.3,
/// at 64 110.9, 152.0 against 93.3, 123.7; Q4_1 at 16 26.9, 29.1 against
/// 23.8, 25.5, at 64 106.9, 117.6 against 84.1, 90.4; at 14 (`--tokens
/// 10,12,14`, two runs) Q4_K 28.4, 27.2 against 26.2, 25.0 and Q4_1 25.0,
/// 26.9 against 22.7, 25.9; at 10 and 12 even (within 5% either way); at 8
/// tokens the AMX tiles 7–12% slower (18.7, 20.1 against 20.1, 21.9 on
/// Q4_K), where the VNNI tiles' tokens go four a tile with none left over. A biased panel
/// (Q4_0, Q6_K: the bias added to the sums as one more vector operation) or
/// one of bytes (Q8_0; Q6_K's groups of 16 a whole tile multiply for a
/// quarter of its width) lost at every count (docs/serve.md).
pub const AMX_TOKENS: usize = 14;

/// The shortest rows for which [`Amx::WherePaying`] takes the AMX tiles: a
/// tile's pipeline (runs staged and multiplies issued three groups ahead)
/// fills and drains once a row block, and the tiles are configured once a
/// task, which short rows do not pay back. Llama 3.2 1B's matrices (rows of
/// 2048 and 8192) gain (above); SmolLM2-135M's (576 and 1536; `batch_gemm
/// q4_1 --tokens 16,32 --rounds 5`, two runs) lose: Q4_1 at 16 tokens 9.41,
/// 9.60 ms on VNNI against 10.13, 10.22 on AMX, at 32 16.86, 16.75 against
/// 17.80, 18.01, and its server at 16 clients ran 4–7% slower with them in
/// four rounds of four.
pub const AMX_MIN_K: usize = 2048;

/// How the int8 GEMM multiplies: the ISA level of its packing and tiles, and
/// where AMX tile multiplies take the VNNI tiles' integer sums (the same bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct I8Kernel {
    pub isa: Isa,
    pub amx: Amx,
}

/// Which panels AMX's tile multiplies take (the `amx` parameter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Amx {
    /// None: the VNNI tiles (`amx` 0).
    Never,
    /// Every panel (`amx` 1).
    Always,
    /// Where they measured faster than the VNNI tiles (`amx` 2): kept nibble
    /// panels without a bias (Q4_K's, Q4_1's: a server's, whose engine keeps
    /// its panels; one packed for a single call holds bytes) of rows of
    /// [`AMX_MIN_K`] or more, times [`AMX_TOKENS`] tokens or more.
    WherePaying,
}

impl I8Kernel {
    /// The VNNI tiles at `isa` (the portable loops below it).
    pub fn vnni(isa: Isa) -> I8Kernel {
        I8Kernel { isa, amx: Amx::Never }
    }

    /// As the kernel's `isa` and `amx` parameters ask (AMX only where it runs).
    pub fn of(params: &Params) -> Result<I8Kernel, KernelError> {
        let isa = Isa::of(params)?;
        let amx = match param(params, "amx")? {
            _ if !(i8_gemm_simd(isa) && amx_granted()) => Amx::Never,
            1 => Amx::Always,
            2 => Amx::WherePaying,
            _ => Amx::Never,
        };
        Ok(I8Kernel { isa, amx })
    }

    /// Whether AMX's tiles take panel `p` (rows of `k`) times `tokens` tokens.
    fn amx_takes(&self, p: &Panel, k: usize, tokens: usize) -> bool {
        match self.amx {
            Amx::Never => false,
            Amx::Always => true,
            Amx::WherePaying => p.nib && p.bias == 0 && k >= AMX_MIN_K && tokens >= AMX_TOKENS,
        }
    }
}

/// Whether AMX's tile multiplies run here (listed by the CPU, granted by the system).
pub fn amx_granted() -> bool {
    #[cfg(target_arch = "x86_64")]
    return x86::amx::granted();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Weight rows per interleaved block (the lanes of a 512-bit vector).
const RB: usize = 16;
/// Elements per `vpdpbusd` lane.
const LANE: usize = 4;

/// Elements sharing one scale and offset in the panel: the format's scale group
/// (16 for the formats whose scales change every 16 elements, else 32).
fn scale_group(format: QFormat) -> usize {
    format.ops().layout.scale_group
}

/// Activations of `m` tokens as int8 blocks, laid out for [`rows_times_tokens_i8`].
/// Its arrays ([`XArrays`], read through `Deref`) are kept by the thread when
/// it is dropped and reused by the next panel it quantizes: a decode batch
/// quantizes a panel for every projection of every layer, seven allocations
/// each otherwise (a fortieth of a SmolLM2 8-sequence pass's time, all of it
/// on the engine's thread while the pool's workers wait).
pub struct XPanel {
    pub k: usize,
    pub m: usize,
    a: XArrays,
    /// The codes scale group by scale group (`[k / sg][m][sg]`, groups of 16
    /// and of 32), made the first time the AMX tiles ask: a tile load reads
    /// each token's group `k` bytes apart in `q`, which at `k` 2048 or more
    /// puts the 16 rows in one or two sets of the L1 cache.
    by_group: [std::sync::OnceLock<Vec<i8>>; 2],
}

/// An [`XPanel`]'s arrays. Each may run longer than the panel: a kept
/// array's tail past `m` tokens, never read.
#[derive(Default)]
pub struct XArrays {
    /// `[m][k]` int8 codes.
    q: Vec<i8>,
    /// `[m][k / 32]` block scales `d`.
    d: Vec<f32>,
    /// `[m][k / 16]`: `d * Σ q` per group of 16.
    sum16: Vec<f32>,
    /// `[m][k / 32]`: `d * Σ q` per block.
    sum32: Vec<f32>,
    /// `[m][k / 32]`: `Σ q` per block, and `[m][k / 16]` per half block (the
    /// integer corrections of a biased panel).
    isum: Vec<i32>,
    isum16: Vec<i32>,
}

impl std::ops::Deref for XPanel {
    type Target = XArrays;
    fn deref(&self) -> &XArrays {
        &self.a
    }
}

thread_local! {
    /// The arrays of this thread's dropped panels (a few: a kernel holds one
    /// panel at a time, a parallel group's kernels one each).
    static X_SPARE: RefCell<Vec<XArrays>> = const { RefCell::new(Vec::new()) };
}

/// Panels' arrays a thread keeps.
const X_KEPT: usize = 4;

/// `v` with `len` elements or more (a kept array keeps its longest length, so
/// a panel of the down projection's `k` after one of the others' zeroes
/// nothing; every element of an `m × k` panel is written before it is read:
/// [`XPanel::quantize`] writes each block's codes and sums).
fn sized<T: Copy + Default>(mut v: Vec<T>, len: usize) -> Vec<T> {
    if v.len() < len {
        v.resize(len, T::default());
    }
    v
}

impl XPanel {
    /// Quantizes the `m` rows of `x` (`[m][k]`, k a multiple of 32) in place,
    /// the tokens in parallel on the pool, one token a task.
    pub fn quantize(x: &[f32], m: usize, k: usize) -> XPanel {
        let nb = k / QK;
        // The smallest kept arrays that hold the panel, else the largest (grown).
        let kept = super::take_local(&X_SPARE, |a| a.q.len() >= m * k && a.d.len() >= m * nb, |a| a.q.len()).unwrap_or_default();
        let mut a = XArrays {
            q: sized(kept.q, m * k),
            d: sized(kept.d, m * nb),
            sum16: sized(kept.sum16, m * 2 * nb),
            sum32: sized(kept.sum32, m * nb),
            isum: sized(kept.isum, m * nb),
            isum16: sized(kept.isum16, m * 2 * nb),
        };
        // Each token's share of every array, handed to its task.
        let mut rows: smallvec::SmallVec<[TokenRow<'_>; 16]> = a.q[..m * k]
            .chunks_exact_mut(k)
            .zip(a.d[..m * nb].chunks_exact_mut(nb))
            .zip(a.sum16[..m * 2 * nb].chunks_exact_mut(2 * nb).zip(a.sum32[..m * nb].chunks_exact_mut(nb)))
            .zip(a.isum16[..m * 2 * nb].chunks_exact_mut(2 * nb).zip(a.isum[..m * nb].chunks_exact_mut(nb)))
            .map(|(((q, d), (sum16, sum32)), (isum16, isum))| TokenRow { q, d, sum16, sum32, isum16, isum })
            .collect();
        let one = |t: usize, row: &mut TokenRow<'_>| {
            let TokenRow { q, d, sum16, sum32, isum16, isum } = row;
            quantize_row(&x[t * k..(t + 1) * k], false, q, |b, db, s| {
                d[b] = db;
                isum16[2 * b..2 * b + 2].copy_from_slice(&s);
                isum[b] = s[0] + s[1];
                sum16[2 * b] = db * s[0] as f32;
                sum16[2 * b + 1] = db * s[1] as f32;
                sum32[b] = db * (s[0] + s[1]) as f32;
            });
        };
        super::pool::for_chunks_mut(&mut rows, 1, |t, row| one(t, &mut row[0]));
        drop(rows);
        XPanel { k, m, a, by_group: Default::default() }
    }

    /// The codes group by group of `sg` (16 or 32): token `t`'s element
    /// `g * sg + e` at `(g * m + t) * sg + e`.
    fn by_group(&self, sg: usize) -> &[i8] {
        self.by_group[usize::from(sg == QK)].get_or_init(|| {
            let (m, k) = (self.m, self.k);
            let mut v = vec![0i8; m * k];
            for (g, dst) in v.chunks_exact_mut(m * sg).enumerate() {
                for (t, row) in dst.chunks_exact_mut(sg).enumerate() {
                    row.copy_from_slice(&self.q[t * k + g * sg..][..sg]);
                }
            }
            v
        })
    }

    /// `d · Σq` per scale group of `sg` elements (16 or 32), per token.
    fn group_sums(&self, sg: usize) -> &[f32] {
        if sg == GROUP { &self.sum16 } else { &self.sum32 }
    }
}

impl Drop for XPanel {
    fn drop(&mut self) {
        let a = std::mem::take(&mut self.a);
        if a.q.capacity() > 0 {
            super::give_local(&X_SPARE, a, X_KEPT);
        }
    }
}

/// One token's rows of an [`XPanel`]'s arrays, written by its quantizing task.
struct TokenRow<'a> {
    q: &'a mut [i8],
    d: &'a mut [f32],
    sum16: &'a mut [f32],
    sum32: &'a mut [f32],
    isum16: &'a mut [i32],
    isum: &'a mut [i32],
}

/// Weight rows in the interleaved layout (see the module docs), reused by a thread.
#[derive(Default)]
struct Panel {
    /// Scale group size (16 or 32) and the number of row blocks.
    sg: usize,
    blocks: usize,
    /// The weight rows packed (the last block's rows past them are zeros).
    rows: usize,
    /// `vals` holds two runs in each 64 bytes, the first in the low nibbles
    /// ([`Panel::into_nibbles`]: a kept panel of 4-bit values, half the bytes
    /// to stream); the SIMD tiles read it, the portable loops never get one.
    nib: bool,
    /// `[block][group][run of 4][row 16][4]`.
    vals: Vec<u8>,
    /// `[block][group][row 16]`.
    scale: Vec<f32>,
    off: Vec<f32>,
    /// The scales and offsets as halves instead (`scale` and `off` then empty),
    /// where every one is a half exactly ([`Panel::into_halves`]: a kept panel
    /// of Q4_0, Q4_1 or Q8_0, whose scales are the format's own f16 numbers):
    /// the SIMD tiles read them, the portable loops never get them.
    halves: Option<(Vec<half::f16>, Vec<half::f16>)>,
    /// Non-zero when every offset is `-bias · scale` (packed directly: Q8_0 128,
    /// Q4_0 8, Q5_0 16; staged: 128 where the format has no offset of its own,
    /// e.g. Q6_K, IQ4_NL): the SIMD tiles then start each group's integer sums at
    /// `-bias · Σq` and skip the offset's multiply-add.
    bias: i32,
    /// The 16 rows' values of a row block, and one format block's scales and
    /// offsets, before they are interleaved.
    row: Vec<u8>,
    row_scale: Vec<f32>,
    row_off: Vec<f32>,
}

impl Panel {
    /// Packs rows `r0..r0 + rows` of `w`: per row block, each of the 16 rows'
    /// values into a staging area (and its scales and offsets straight into
    /// place), then every 32 elements of the 16 rows transposed by runs of 4 into
    /// the panel (one 16 x 8 dword transpose, AVX-512 where the SIMD kernel runs).
    /// Rows past `rows` in the last block are zeros.
    fn pack(&mut self, isa: Isa, w: QView<'_>, r0: usize, rows: usize, k: usize) {
        let sg = scale_group(w.format);
        let (blocks, groups) = (rows.div_ceil(RB), k / sg);
        self.sg = sg;
        self.blocks = blocks;
        self.rows = rows;
        self.nib = false;
        self.halves = None;
        // Every value, scale and offset is written below: no clearing.
        self.vals.resize(blocks * RB * k, 0);
        self.scale.resize(blocks * groups * RB, 0.0);
        self.off.resize(blocks * groups * RB, 0.0);
        self.bias = 0;
        #[cfg(target_arch = "x86_64")]
        if i8_gemm_simd(isa) && direct(w) {
            // SAFETY: AVX-512F/BW checked; the panel is sized for `rows` rows of k
            // above and `w` holds rows r0..r0 + rows of k in rows of blocks.
            unsafe { direct::pack(self, w, r0, rows, k) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if let Layout::X8 { bpr } = w.layout
            && i8_gemm_simd(isa)
            && w.format.ops().cpu.panel.direct_x8
            && r0.is_multiple_of(X8_ROWS)
            && bpr * QK == k
        {
            // SAFETY: AVX-512F/BW checked; the panel is sized for `rows` rows of k;
            // `w` holds whole 8-row groups of `bpr` records, r0 starts a group.
            unsafe { direct::pack_x8(self, w, r0, rows, k) };
            return;
        }
        self.pack_staged(isa, w, r0, rows, k);
    }

    /// [`Panel::pack`] through the staging rows: any format and layout.
    fn pack_staged(&mut self, isa: Isa, w: QView<'_>, r0: usize, rows: usize, k: usize) {
        let (sg, kind) = (scale_group(w.format), w.format.ops().cpu.panel.stage);
        let (blocks, groups) = (rows.div_ceil(RB), k / sg);
        let be = w.format.block_elems();
        let per_row = k / be;
        let mut u = Unpacked::default();
        let stage = &mut self.row;
        stage.resize(RB * k, 0);
        let (sc, of) = (&mut self.row_scale, &mut self.row_off);
        sc.resize(be / sg, 0.0);
        of.resize(be / sg, 0.0);
        #[cfg(target_arch = "x86_64")]
        let simd = i8_gemm_simd(isa);
        for blk in 0..blocks {
            // Each row of the block read front to back (one stream at a time for
            // the prefetcher) into the staging rows.
            for lane in 0..RB {
                let i = blk * RB + lane;
                let row = &mut stage[lane * k..(lane + 1) * k];
                if i >= rows {
                    row.fill(0);
                    for g in 0..groups {
                        (self.scale[(blk * groups + g) * RB + lane], self.off[(blk * groups + g) * RB + lane]) = (0.0, 0.0);
                    }
                    continue;
                }
                for b in 0..per_row {
                    let e0 = b * be;
                    if let Layout::X8 { bpr } = w.layout
                        && kind == Stage::K4Nibbles
                    {
                        unpack_x8(w, r0 + i, b, bpr, &mut row[e0..e0 + be], sc, of);
                    } else {
                        // The row layout's block, or a repacked 32-element block
                        // gathered back (16 or 32 code bytes: a few loads).
                        w.with_block((r0 + i) * per_row + b, |q, s| {
                            unpack_block(isa, w.format, kind, q, s, &mut row[e0..e0 + be], sc, of, &mut u)
                        });
                    }
                    for g in 0..be / sg {
                        let j = (blk * groups + e0 / sg + g) * RB + lane;
                        (self.scale[j], self.off[j]) = (sc[g], of[g]);
                    }
                }
            }
            for c in 0..k / QK {
                // Elements 32c.. of the 16 rows: 8 runs of 64 bytes at RB * 32c
                // within the block (whatever the scale group).
                let dst = &mut self.vals[blk * k * RB + RB * QK * c..][..RB * QK];
                let src = &stage[QK * c..];
                #[cfg(target_arch = "x86_64")]
                if simd {
                    // SAFETY: AVX-512F checked; src holds 16 rows of k from 32c, dst 512 bytes.
                    unsafe { transpose16x8(src.as_ptr(), k, dst.as_mut_ptr()) };
                    continue;
                }
                for lane in 0..RB {
                    for r in 0..QK / LANE {
                        dst[r * RB * LANE + lane * LANE..][..LANE].copy_from_slice(&src[lane * k + r * LANE..][..LANE]);
                    }
                }
            }
        }
        // Values `v + 128` with no offset of the format's own: every offset is
        // exactly `-128 · scale`.
        self.bias = if self.off.iter().zip(&self.scale).all(|(&o, &sc)| o == -128.0 * sc) { 128 } else { 0 };
    }
}

/// [`unpack_block`] of Q4_K block `c` of row `r` of a [`Layout::X8`] matrix
/// (rows of `bpr` blocks), read from its repacked record.
fn unpack_x8(w: QView<'_>, r: usize, c: usize, bpr: usize, vals: &mut [u8], sc: &mut [f32], of: &mut [f32]) {
    let (g, i) = (r / X8_ROWS, r % X8_ROWS);
    let rec: &[u8; X8_BYTES] = w.quants[(g * bpr + c) * X8_BYTES..][..X8_BYTES].try_into().unwrap();
    let s = &w.scales[(g * bpr + c) * 2 * X8_ROWS..][..2 * X8_ROWS];
    let (d, dmin) = (s[i].to_f32(), s[X8_ROWS + i].to_f32());
    let vals: &mut [u8; QK_K] = (&mut vals[..QK_K]).try_into().unwrap();
    for p in 0..4 {
        let raw = x8_row_codes(rec, i, p);
        let (lo, hi) = vals[64 * p..64 * p + 64].split_at_mut(32);
        for l in 0..32 {
            lo[l] = raw[l] & 0x0f;
            hi[l] = raw[l] >> 4;
        }
    }
    for j in 0..8 {
        let (s, m) = x8_scale_min(rec, i, j);
        (sc[j], of[j]) = (d * s as f32, -dmin * m as f32);
    }
}

/// One format block of one row as unsigned bytes `u` with `value = sc · u + of`
/// per scale group: Q4_0, Q4_1, Q4_K nibbles as they are (offsets -8d, m, -dmin·m),
/// Q8_0 codes + 128 (-128d), the other formats through [`Unpacked`] (`v + 128`).
#[allow(clippy::too_many_arguments)]
#[inline]
fn unpack_block(
    isa: Isa,
    format: QFormat,
    stage: Stage,
    q: &[u8],
    s: &[half::f16],
    vals: &mut [u8],
    sc: &mut [f32],
    of: &mut [f32],
    u: &mut Unpacked,
) {
    match stage {
        Stage::Bytes => {
            let (q, vals): (&[u8; QK], &mut [u8; QK]) = (q[..QK].try_into().unwrap(), (&mut vals[..QK]).try_into().unwrap());
            for (o, &c) in vals.iter_mut().zip(q) {
                *o = c ^ 0x80;
            }
            let d = s[0].to_f32();
            (sc[0], of[0]) = (d, -128.0 * d);
        }
        Stage::Nibbles => {
            let q: &[u8; 16] = q[..16].try_into().unwrap();
            let (lo, hi) = vals[..QK].split_at_mut(16);
            let (lo, hi): (&mut [u8; 16], &mut [u8; 16]) = (lo.try_into().unwrap(), hi.try_into().unwrap());
            for j in 0..16 {
                lo[j] = q[j] & 0x0f;
                hi[j] = q[j] >> 4;
            }
            let d = s[0].to_f32();
            (sc[0], of[0]) = (d, if format.has_offset() { s[1].to_f32() } else { -8.0 * d });
        }
        Stage::K4Nibbles => {
            let (d, dmin) = (s[0].to_f32(), s[1].to_f32());
            for jj in 0..4 {
                let raw: &[u8; 32] = q[12 + 32 * jj..][..32].try_into().unwrap();
                let (lo, hi) = vals[64 * jj..64 * jj + 64].split_at_mut(32);
                let (lo, hi): (&mut [u8; 32], &mut [u8; 32]) = (lo.try_into().unwrap(), hi.try_into().unwrap());
                for l in 0..32 {
                    lo[l] = raw[l] & 0x0f;
                    hi[l] = raw[l] >> 4;
                }
            }
            let sm = scales_mins_k4(q);
            for g in 0..8 {
                (sc[g], of[g]) = (d * sm[g] as f32, -dmin * sm[8 + g] as f32);
            }
        }
        Stage::Unpacked => {
            let be = format.block_elems();
            unpack_fast(isa, format, q, s, u);
            for (o, &v) in vals.iter_mut().zip(&u.vals[..be]) {
                *o = (v as u8) ^ 0x80;
            }
            // Unpacked has a scale and offset per 16; a group of 32 takes the
            // first of its two (equal for these formats).
            let sg = scale_group(format);
            for g in 0..be / sg {
                let j = g * sg / GROUP;
                (sc[g], of[g]) = (u.scale[j], u.off[j] - 128.0 * u.scale[j]);
            }
        }
    }
}

/// Whether [`direct::pack`] reads `w`: the 32-element formats whose codes are
/// bytes or nibbles used as they are, in rows of blocks. (Q4_K through the same
/// direct reads measured 7% slower than staged: its 32-byte code runs are read
/// twice, once per nibble, at a stride that crosses cache lines.)
fn direct(w: QView<'_>) -> bool {
    w.layout == Layout::Rows && w.format.ops().cpu.panel.direct.is_some()
}

#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
use x86::{direct, transpose16x8, vnni};

thread_local! {
    static PANEL: RefCell<Panel> = RefCell::new(Panel::default());
}

/// Whether the SIMD path can run at `isa` (AVX-512 VNNI with BW).
pub fn i8_gemm_simd(isa: Isa) -> bool {
    isa.vnni() && features().avx512f
}

impl Panel {
    /// This panel with two runs of 4-bit values in each 64 bytes (the run of
    /// even index in the low nibbles), when every value fits in 4 bits (Q4_0,
    /// Q4_1 and Q4_K pack their nibbles as they are); else as it is.
    fn into_nibbles(mut self) -> Panel {
        let run = RB * LANE;
        if self.nib || self.vals.iter().any(|&v| v > 15) || !self.vals.len().is_multiple_of(2 * run) {
            return self;
        }
        let mut packed = vec![0u8; self.vals.len() / 2];
        for (dst, pair) in packed.chunks_exact_mut(run).zip(self.vals.chunks_exact(2 * run)) {
            let (lo, hi) = pair.split_at(run);
            for ((d, &l), &h) in dst.iter_mut().zip(lo).zip(hi) {
                *d = l | (h << 4);
            }
        }
        self.vals = packed;
        self.nib = true;
        self
    }

    /// This panel with its scales and offsets as halves when every one is a
    /// half exactly (the same numbers, so the same results: a kept panel of a
    /// 32-element format then streams as few bytes a row as the format's own
    /// blocks; the tiles are bound by that stream at a decode batch's few
    /// tokens); else as it is. A biased panel's offsets, which the tiles do not
    /// read, are dropped.
    fn into_halves(mut self) -> Panel {
        let exact = |v: &[f32]| v.iter().all(|&x| half::f16::from_f32(x).to_f32().to_bits() == x.to_bits());
        if self.halves.is_some() || !exact(&self.scale) || (self.bias == 0 && !exact(&self.off)) {
            return self;
        }
        let halves = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x)).collect::<Vec<_>>();
        let off = if self.bias == 0 { halves(&self.off) } else { Vec::new() };
        self.halves = Some((halves(&self.scale), off));
        (self.scale, self.off) = (Vec::new(), Vec::new());
        self
    }

    /// The bytes the tiles read: values, scales, offsets (where not folded).
    fn streams(&self) -> [&[u8]; 3] {
        let [scale, off]: [&[u8]; 2] = match &self.halves {
            Some((s, o)) => [bytemuck::cast_slice(s), bytemuck::cast_slice(o)],
            None => [bytemuck::cast_slice(&self.scale), bytemuck::cast_slice(&self.off)],
        };
        [&self.vals, scale, if self.bias == 0 { off } else { &[] }]
    }
}

/// Packed rows kept for the life of the weights they were packed from: an
/// engine that runs the int8 GEMMs again and again over few tokens (a server's
/// decode batches) keeps each task's panel instead of unpacking its rows every
/// pass, which at 8 tokens costs more than the arithmetic. The same panels as a
/// pass packs (the same values), so the same results. Keyed by the weight's
/// address and length, then by the rows' first block: its owner must outlive
/// nothing it packed (an engine owns one for its own weights, [`with_panels`]
/// during its passes).
#[derive(Default)]
pub struct PanelCache {
    panels: std::sync::Mutex<KeptPanels>,
}

/// Each weight's slots by (weight address and bytes, scales address, format,
/// the SIMD tiles' form).
type KeptPanels = std::collections::HashMap<(usize, usize, usize, usize, bool), Slots>;

/// A weight's kept panels, a slot per row block (16 rows) where a task's rows
/// may start, the panels in place (a task reads the next one's fields to
/// fetch its rows: behind a pointer that was a miss a task).
type Slots = std::sync::Arc<[std::sync::OnceLock<Panel>]>;

/// One weight's kept panels, looked up once per kernel call ([`PanelCache::weight`])
/// and read by its tasks without a lock: every pool task of a decode batch's
/// GEMM (a microsecond of arithmetic at 8 tokens) looked its panel up in the
/// shared map, under one lock the threads contended for (a tenth of a decode
/// batch's samples with the hashing and the reference counts).
pub struct KeptWeight {
    slots: Slots,
}

impl PanelCache {
    /// The kept panels of `w` (rows of `k`) for the kernel `isa` runs.
    pub fn weight(&self, isa: Isa, w: QView<'_>, k: usize) -> Option<KeptWeight> {
        let rows = w.quants.len() / row_bytes(w, k).max(1);
        let blocks = rows.div_ceil(RB);
        let key = (w.quants.as_ptr() as usize, w.quants.len(), w.scales.as_ptr() as usize, w.format as usize, i8_gemm_simd(isa));
        let mut m = self.panels.lock().ok()?;
        let slots = m.entry(key).or_insert_with(|| (0..blocks).map(|_| std::sync::OnceLock::new()).collect());
        Some(KeptWeight { slots: slots.clone() })
    }

    /// Bytes the kept panels hold.
    pub fn bytes(&self) -> usize {
        self.panels.lock().map_or(0, |m| {
            m.values()
                .flat_map(|slots| slots.iter().filter_map(std::sync::OnceLock::get))
                .map(|p| {
                    let halves = p.halves.as_ref().map_or(0, |(s, o)| 2 * (s.len() + o.len()));
                    p.vals.len() + 4 * (p.scale.len() + p.off.len()) + halves
                })
                .sum()
        })
    }
}

thread_local! {
    /// The panel cache of the engine whose pass this thread runs ([`with_panels`]).
    static ACTIVE: RefCell<Option<std::sync::Arc<PanelCache>>> = const { RefCell::new(None) };
}

/// Runs `f` with `cache` keeping the panels of the int8 GEMMs it calls on this
/// thread (a kernel reads it before handing its tasks to the pool).
pub fn with_panels<R>(cache: &std::sync::Arc<PanelCache>, f: impl FnOnce() -> R) -> R {
    let before = ACTIVE.with(|a| a.replace(Some(cache.clone())));
    let out = f();
    ACTIVE.with(|a| *a.borrow_mut() = before);
    out
}

/// The panel cache [`with_panels`] set on this thread, if any.
pub fn active_panels() -> Option<std::sync::Arc<PanelCache>> {
    ACTIVE.with(|a| a.borrow().clone())
}

/// Where a call of the tiles writes: `data` token-major, `stride` floats a
/// token, the call's rows from `row` of each (a task's rows served by several
/// kept panels, each writing its part).
pub(super) struct OutRows<'a> {
    data: &'a mut [f32],
    stride: usize,
    row: usize,
}

/// How far back from a row block [`KeptWeight::covering`] looks for a kept
/// panel reaching it (tasks pack at most a few hundred rows).
const MAX_BACK: usize = 32;

impl KeptWeight {
    /// The kept panel holding row `r` (a row block's first) and `r`'s block
    /// within it: the panel of `r`'s slot, else one of an earlier slot that
    /// reaches past `r` (a prompt's task of 64 rows serves a decode batch's
    /// task at its row 32), else `rows` rows from `r` packed into `r`'s slot.
    fn covering(&self, isa: Isa, w: QView<'_>, r: usize, rows: usize, k: usize) -> Option<(&Panel, usize)> {
        let s = r / RB;
        let slot = self.slots.get(s)?;
        if let Some(p) = slot.get() {
            return Some((p, 0));
        }
        for back in 1..=s.min(MAX_BACK) {
            if let Some(p) = self.slots[s - back].get()
                && p.rows > back * RB
            {
                return Some((p, back));
            }
        }
        let simd = i8_gemm_simd(isa);
        Some((
            slot.get_or_init(|| {
                let mut p = Panel::default();
                p.pack(isa, w, r, rows, k);
                // The SIMD tiles read 4-bit values two to a byte, and scales as
                // halves where they are.
                if simd { p.into_nibbles().into_halves() } else { p }
            }),
            0,
        ))
    }
}

/// `y[t, r]` for rows `r0..r0 + count` of `w` and every token of `x`: the rows
/// packed once (or read from `kept`'s panels: each row block's from the panel
/// that holds it, whichever task packed it, a block with none packed there the
/// first time with the rest of the task's rows, so tasks of other sizes (a
/// prompt's GEMM in tasks of 64 rows, then a decode batch's in tasks of 32)
/// share one copy and none packs again; rows not starting a block are packed
/// each time), then the interleaved int8 kernel (VNNI when `isa` has it, AMX's
/// tile multiplies where `kernel.amx` asks, else the portable loops of the same
/// arithmetic), into `out` token-major
/// (`[m][count]`).
pub fn rows_times_tokens_i8(
    kernel: I8Kernel,
    x: &XPanel,
    w: QView<'_>,
    r0: usize,
    count: usize,
    kept: Option<&KeptWeight>,
    out: &mut [f32],
) {
    let isa = kernel.isa;
    let (m, k) = (x.m, x.k);
    let out = &mut out[..count * m];
    let end = r0 + count;
    let mut r = r0;
    if let Some(kept) = kept
        && r0.is_multiple_of(RB)
    {
        while r < end && r.is_multiple_of(RB) {
            let Some((p, at)) = kept.covering(isa, w, r, end - r, k) else { break };
            let n = (p.rows - at * RB).min(end - r);
            let o = OutRows { data: &mut *out, stride: count, row: r - r0 };
            // The next rows' panel (which this thread most likely computes
            // next: pool tasks come in runs of consecutive chunks), fetched
            // into L2 while these compute: each panel is a stream of its own,
            // a few KiB, too short for the hardware prefetcher to ramp up on.
            let next = (r + n).is_multiple_of(RB).then(|| kept.slots.get((r + n) / RB)).flatten();
            let next = next.and_then(std::sync::OnceLock::get).map_or([&[][..]; 3], Panel::streams);
            panel_rows(kernel, p, at, x, n, o, &next);
            r += n;
        }
        if r == end {
            return;
        }
    }
    #[cfg(test)]
    tests::PACKED_ANEW.with(|n| n.set(n.get() + 1));
    let (row, count_left) = (r - r0, end - r);
    let mut run = |p: &mut Panel| {
        p.pack(isa, w, r, count_left, k);
        // The weight bytes of the next rows as many, which this thread most
        // likely packs next (pool tasks come in runs of consecutive chunks):
        // fetched into L2 while these rows compute, so the packing, which
        // otherwise waits on DRAM, overlaps the arithmetic.
        let rb = row_bytes(w, k);
        let next = &w.quants[(end * rb).min(w.quants.len())..((end + count_left) * rb).min(w.quants.len())];
        panel_rows(kernel, p, 0, x, count_left, OutRows { data: &mut *out, stride: count, row }, &[next]);
    };
    PANEL.with(|c| match c.try_borrow_mut() {
        Ok(mut p) => run(&mut p),
        Err(_) => run(&mut Panel::default()),
    });
}

/// `n` rows of `p` from its row block `at` times every token of `x`, into `o`:
/// the VNNI tiles where `isa` has them (bringing the runs of `next` into L2
/// meanwhile), else the portable loops of the same arithmetic.
#[inline]
fn panel_rows(kernel: I8Kernel, p: &Panel, at: usize, x: &XPanel, n: usize, o: OutRows<'_>, next: &[&[u8]]) {
    assert!(n <= p.rows.saturating_sub(at * RB) && (at * RB + n).div_ceil(RB) <= p.blocks, "rows {at}·16 + {n} of a panel of {}", p.rows);
    #[cfg(target_arch = "x86_64")]
    if i8_gemm_simd(kernel.isa) {
        // SAFETY: AVX-512F/BW/VL/VNNI checked (and AMX granted where the kernel
        // takes it: `I8Kernel` sets `amx` only then); the panel holds rows
        // `at * 16..at * 16 + n` of k in whole blocks of 16 (asserted), `x` m
        // tokens of k (k a multiple of 32, as `XPanel::quantize` takes them);
        // every store into `o` is checked.
        unsafe {
            if kernel.amx_takes(p, x.k, x.m) && amx_granted() {
                x86::amx::rows_times_tokens(p, at, x, n, o, next)
            } else {
                vnni::rows_times_tokens(p, at, x, n, o, next)
            }
        };
        return;
    }
    let _ = next;
    scalar(p, at, x, n, o);
}

/// Bytes of `quants` per weight row of `k` elements (an X8 record holds 8 rows'
/// blocks: an eighth of it per row).
fn row_bytes(w: QView<'_>, k: usize) -> usize {
    match w.layout {
        Layout::Rows => k / w.format.block_elems() * w.format.quant_bytes(),
        Layout::X8 { .. } => k / w.format.block_elems() * crate::kernels::quant::x8_record_bytes(w.format) / X8_ROWS,
    }
}

/// The portable loops: per scale group, each row's integer sum of products, then
/// `scale · d · Σ + off · d · Σq`, as the SIMD lanes do; `n` rows from the
/// panel's block `at` into `o`.
fn scalar(p: &Panel, at: usize, x: &XPanel, n: usize, o: OutRows<'_>) {
    let (m, k, sg) = (x.m, x.k, p.sg);
    let groups = k / sg;
    let sums = x.group_sums(sg);
    for i in 0..n {
        let (blk, lane) = (at + i / RB, i % RB);
        for t in 0..m {
            let mut acc = 0f32;
            for g in 0..groups {
                let base = (blk * groups + g) * sg * RB;
                let mut dot = 0i32;
                for r in 0..sg / LANE {
                    let wv = &p.vals[base + r * RB * LANE + lane * LANE..][..LANE];
                    let xv = &x.q[t * k + g * sg + r * LANE..][..LANE];
                    dot += wv.iter().zip(xv).map(|(&a, &b)| a as i32 * b as i32).sum::<i32>();
                }
                let j = (blk * groups + g) * RB + lane;
                let d = x.d[t * (k / QK) + g * sg / QK];
                acc += p.scale[j] * d * dot as f32 + p.off[j] * sums[t * groups + g];
            }
            o.data[t * o.stride + o.row + i] = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant::QMatrix;

    fn data(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    thread_local! {
        /// Calls of [`rows_times_tokens_i8`] on this thread that packed their
        /// rows anew (no kept panel served them).
        pub(super) static PACKED_ANEW: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// [`rows_times_tokens_i8`]'s `[m][count]` block, allocated.
    fn i8_rows(isa: Isa, xp: &XPanel, w: QView<'_>, r0: usize, count: usize, kept: Option<&KeptWeight>) -> Vec<f32> {
        i8_rows_by(I8Kernel::vnni(isa), xp, w, r0, count, kept)
    }

    /// [`i8_rows`] by the kernel given (AMX's tiles or the VNNI ones).
    fn i8_rows_by(kernel: I8Kernel, xp: &XPanel, w: QView<'_>, r0: usize, count: usize, kept: Option<&KeptWeight>) -> Vec<f32> {
        let mut out = vec![0f32; count * xp.m];
        rows_times_tokens_i8(kernel, xp, w, r0, count, kept, &mut out);
        out
    }

    /// The panel, quantized in place on the pool, holds for each token what
    /// the decode path's [`XQ8`](super::super::XQ8) of that token holds: the
    /// same codes, scales and sums (integer and scaled, per half and per block),
    /// also when the panel's arrays are a larger earlier panel's, kept by the
    /// thread with that panel's numbers in them.
    #[test]
    fn panel_tokens_are_the_decode_quantization_of_each_token() {
        let (m, k) = (7usize, 96usize);
        let mut x = data(m * k, 5);
        // An outlier block and a zero block: the scale search and its zero case.
        x[40] = 30.0;
        x[3 * k..3 * k + 32].fill(0.0);
        for kept in [false, true] {
            if kept {
                drop(XPanel::quantize(&data(9 * 1536, 11), 9, 1536));
            }
            panel_matches_decode(&x, m, k);
        }
    }

    fn panel_matches_decode(x: &[f32], m: usize, k: usize) {
        let p = XPanel::quantize(x, m, k);
        let nb = k / QK;
        for t in 0..m {
            let xq = super::super::XQ8::quantize(&x[t * k..(t + 1) * k]);
            assert_eq!(p.q[t * k..(t + 1) * k], xq.q[..], "codes of token {t}");
            assert_eq!(p.d[t * nb..(t + 1) * nb], xq.d[..], "scales of token {t}");
            assert_eq!(p.sum32[t * nb..(t + 1) * nb], xq.dsum[..], "block sums of token {t}");
            assert_eq!(p.sum16[t * 2 * nb..(t + 1) * 2 * nb], xq.dsum16[..], "half sums of token {t}");
            for b in 0..nb {
                let codes = |r: std::ops::Range<usize>| xq.q[r].iter().map(|&v| v as i32).sum::<i32>();
                let (lo, hi) = (codes(b * QK..b * QK + GROUP), codes(b * QK + GROUP..(b + 1) * QK));
                assert_eq!(p.isum16[(t * nb + b) * 2..][..2], [lo, hi], "integer half sums of token {t} block {b}");
                assert_eq!(p.isum[t * nb + b], lo + hi, "integer block sum of token {t} block {b}");
            }
        }
    }

    /// The SIMD tiles (every remainder shape, a 32-element tail) and the portable
    /// loops compute the same sums, and both stay within int8-activation error of
    /// the dequantized product; a token's sums are the same bits whatever tile
    /// shape its pass gave it (1 to 7 tokens: 4 a tile, the rest 1 to 3 together).
    #[test]
    fn int8_gemm_tiles_agree_with_the_scalar_loops_and_the_f32_product() {
        for format in [QFormat::Q4_0, QFormat::Q8_0, QFormat::Q4_1, QFormat::Q4_K, QFormat::Q6_K, QFormat::IQ4_NL] {
            let k = if format.block_elems() == 256 { 512 } else { 96 };
            let (n, m) = (37, 7);
            let wf = data(n * k, 3);
            let w = QMatrix::quantize(format, n, k, &wf).expect("quantizes");
            let x = data(m * k, 5);
            let xp = XPanel::quantize(&x, m, k);
            let deq = w.dequantize();
            let simd = i8_rows(Isa::best(), &xp, w.view(), 0, n, None);
            let portable = i8_rows(Isa::Scalar, &xp, w.view(), 0, n, None);
            let scale = (k as f32).sqrt();
            for r in 0..n {
                for t in 0..m {
                    let exact: f32 = (0..k).map(|e| deq[r * k + e] * x[t * k + e]).sum();
                    let (a, b) = (simd[t * n + r], portable[t * n + r]);
                    assert!((a - b).abs() <= 1e-4 * scale, "{format:?} r{r} t{t}: simd {a} scalar {b}");
                    assert!((a - exact).abs() <= 1e-2 * scale, "{format:?} r{r} t{t}: {a} vs {exact}");
                }
            }
            for fewer in 1..m {
                let xf = XPanel::quantize(&x[..fewer * k], fewer, k);
                let part = i8_rows(Isa::best(), &xf, w.view(), 0, n, None);
                assert!(
                    part.iter().zip(&simd).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{format:?}: the first {fewer} of {m} tokens alone"
                );
            }
        }
    }

    /// The AMX tiles give the VNNI tiles' bits: every form of panel (bytes and
    /// nibbles, offsets and biases, f32 scales and halves: packed each pass and
    /// kept), a partial last row block, 1 to 18 tokens (a tile multiply of 16
    /// and one of the rest).
    #[test]
    fn amx_tiles_are_the_vnni_tiles() {
        if !amx_granted() {
            eprintln!("SKIPPED amx_tiles_are_the_vnni_tiles: this CPU has no AMX or the system does not grant it");
            return;
        }
        let (vnni, amx) = (I8Kernel::vnni(Isa::best()), I8Kernel { isa: Isa::best(), amx: Amx::Always });
        for format in [QFormat::Q4_0, QFormat::Q8_0, QFormat::Q4_1, QFormat::Q4_K, QFormat::Q6_K, QFormat::IQ4_NL] {
            let k = if format.block_elems() == 256 { 512 } else { 96 };
            let n = 37;
            let w = QMatrix::quantize(format, n, k, &data(n * k, 3)).expect("quantizes");
            let x = data(18 * k, 5);
            let (kept_vnni, kept_amx) = (PanelCache::default(), PanelCache::default());
            for m in [1, 2, 3, 5, 8, 15, 16, 17, 18] {
                let xp = XPanel::quantize(&x[..m * k], m, k);
                for (r0, count) in [(0, n), (16, 16)] {
                    let want = i8_rows_by(vnni, &xp, w.view(), r0, count, None);
                    let got = i8_rows_by(amx, &xp, w.view(), r0, count, None);
                    let first = got.iter().zip(&want).position(|(a, b)| a.to_bits() != b.to_bits());
                    assert!(first.is_none(), "{format:?} {m} tokens rows {r0}+{count}: packed panels differ first at {first:?}");
                    let kv = i8_rows_by(vnni, &xp, w.view(), r0, count, kept_vnni.weight(Isa::best(), w.view(), k).as_ref());
                    let ka = i8_rows_by(amx, &xp, w.view(), r0, count, kept_amx.weight(Isa::best(), w.view(), k).as_ref());
                    let first = ka.iter().zip(&kv).position(|(a, b)| a.to_bits() != b.to_bits());
                    assert!(first.is_none(), "{format:?} {m} tokens rows {r0}+{count}: kept panels differ first at {first:?}");
                }
            }
        }
    }

    /// `amx` 2 takes AMX's tiles for the kept nibble panels without a bias
    /// (Q4_K's, Q4_1's) of rows of [`AMX_MIN_K`] or more from [`AMX_TOKENS`]
    /// tokens, the VNNI tiles for the rest (Q4_0's biased nibbles, Q8_0's and
    /// Q6_K's bytes, a panel packed for one call, which holds bytes, shorter
    /// rows) and for fewer tokens; `amx` 1 every panel, 0 none. The bits are
    /// the same either way ([`amx_tiles_are_the_vnni_tiles`]).
    #[test]
    fn amx_where_paying_takes_long_unbiased_nibble_panels_from_amx_tokens() {
        if !i8_gemm_simd(Isa::best()) {
            eprintln!(
                "SKIPPED amx_where_paying_takes_long_unbiased_nibble_panels_from_amx_tokens: no AVX-512 VNNI (no kept nibble panels)"
            );
            return;
        }
        let kernel = |amx| I8Kernel { isa: Isa::best(), amx };
        for (format, pays) in
            [(QFormat::Q4_K, true), (QFormat::Q4_1, true), (QFormat::Q4_0, false), (QFormat::Q8_0, false), (QFormat::Q6_K, false)]
        {
            let k = if format.block_elems() == 256 { 256 } else { 64 };
            let w = QMatrix::quantize(format, 16, k, &data(16 * k, 7)).expect("quantizes");
            let mut packed = Panel::default();
            packed.pack(Isa::best(), w.view(), 0, 16, k);
            let cache = PanelCache::default();
            let weight = cache.weight(Isa::best(), w.view(), k).expect("kept");
            let (kept, _) = weight.covering(Isa::best(), w.view(), 0, 16, k).expect("a kept panel");
            // The panel's form is what decides, with the row length asked.
            for row in [AMX_MIN_K / 2, AMX_MIN_K, 4 * AMX_MIN_K] {
                for tokens in [1, 8, AMX_TOKENS - 1, AMX_TOKENS, 64] {
                    let paying = kernel(Amx::WherePaying).amx_takes(kept, row, tokens);
                    assert_eq!(paying, pays && row >= AMX_MIN_K && tokens >= AMX_TOKENS, "{format:?}, rows of {row}, {tokens} tokens");
                    assert!(!kernel(Amx::WherePaying).amx_takes(&packed, row, tokens), "{format:?}: a panel packed for one call");
                    assert!(kernel(Amx::Always).amx_takes(&packed, row, tokens) && !kernel(Amx::Never).amx_takes(kept, row, tokens));
                }
            }
        }
    }

    /// Rows `r0..r0 + rows` of `w` packed as [`Panel::pack`] packs them, and by the
    /// staged path into a panel of the same sizes (filled with junk first).
    fn packed_and_staged(w: QView<'_>, r0: usize, rows: usize, k: usize) -> (Panel, Panel) {
        let (mut a, mut b) = (Panel::default(), Panel::default());
        a.pack(Isa::best(), w, r0, rows, k);
        b.sg = a.sg;
        b.blocks = a.blocks;
        b.vals.resize(a.vals.len(), 0xaa);
        b.scale.resize(a.scale.len(), f32::NAN);
        b.off.resize(a.off.len(), f32::NAN);
        b.pack_staged(Isa::best(), w, r0, rows, k);
        (a, b)
    }

    /// Two panels' scales and offsets bit for bit.
    fn assert_same_scales(a: &Panel, b: &Panel, format: QFormat) {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.scale), bits(&b.scale), "{format:?}: scales");
        assert_eq!(bits(&a.off), bits(&b.off), "{format:?}: offsets");
    }

    /// The panel packed straight from Q4_0 / Q8_0 X8 records is the one the staged
    /// path gathers from them, bit for bit: whole and half row blocks, groups
    /// from an offset.
    #[test]
    fn x8_packing_is_the_staged_packing() {
        if !i8_gemm_simd(Isa::best()) {
            eprintln!("SKIPPED x8_packing_is_the_staged_packing: no AVX-512 VNNI on this CPU");
            return;
        }
        for format in [QFormat::Q8_0, QFormat::Q4_0] {
            let (n, k) = (56, 160);
            let x8 = QMatrix::quantize(format, n, k, &data(n * k, 13)).expect("quantizes").repack_x8();
            assert!(matches!(x8.layout, Layout::X8 { .. }));
            for (r0, rows) in [(0, n), (8, 24), (16, 8), (40, 16)] {
                let (a, b) = packed_and_staged(x8.view(), r0, rows, k);
                assert_eq!(a.bias, if format == QFormat::Q8_0 { 128 } else { 8 });
                let first = a.vals.iter().zip(&b.vals).position(|(u, v)| u != v);
                assert!(first.is_none(), "{format:?} rows {r0}+{rows}: values differ first at byte {first:?} of {}", a.vals.len());
                assert_same_scales(&a, &b, format);
            }
        }
    }

    /// The direct packing writes the staged packing's panel bit for bit: every
    /// format it reads, a partial last row block, rows from an offset.
    #[test]
    fn direct_packing_is_the_staged_packing() {
        if !i8_gemm_simd(Isa::best()) {
            eprintln!("SKIPPED direct_packing_is_the_staged_packing: no AVX-512 VNNI on this CPU");
            return;
        }
        for format in [QFormat::Q8_0, QFormat::Q4_0, QFormat::Q4_1, QFormat::Q5_0, QFormat::Q5_1] {
            let k = 160;
            let n = 45;
            let w = QMatrix::quantize(format, n, k, &data(n * k, 11)).expect("quantizes");
            assert!(direct(w.view()));
            for (r0, rows) in [(0, n), (3, 21), (29, 16)] {
                let (a, b) = packed_and_staged(w.view(), r0, rows, k);
                if matches!(format, QFormat::Q5_0 | QFormat::Q5_1) {
                    // Raw 5-bit codes here, `v + 128` staged: the same values.
                    for (e, (&ua, &ub)) in a.vals.iter().zip(&b.vals).enumerate() {
                        let j = e / (RB * QK) * RB + e % (RB * LANE) / LANE;
                        let (va, vb) = (a.scale[j] * ua as f32 + a.off[j], b.scale[j] * ub as f32 + b.off[j]);
                        assert!((va - vb).abs() <= 1e-6 * (1.0 + vb.abs()), "{format:?} rows {r0}+{rows} element {e}: {va} vs {vb}");
                    }
                    continue;
                }
                assert_eq!(a.vals, b.vals, "{format:?} rows {r0}+{rows}: values");
                assert_same_scales(&a, &b, format);
            }
        }
    }

    /// Panels kept in a cache (4-bit values two to a byte, scales as halves,
    /// where they are) give what panels packed each pass give, bit for bit, the
    /// first time (packed into it) and after (read from it), in every tile
    /// shape (5, 6 and 7 tokens: a last tile of 1, 2 and 3).
    #[test]
    fn kept_panels_give_the_packed_results() {
        use crate::kernels::quant::QFormat;
        let (n, k, m) = (48, 256, 5);
        let x = data(7 * k, 3);
        let xp = XPanel::quantize(&x[..m * k], m, k);
        let tokens: Vec<XPanel> = (5..=7).map(|t| XPanel::quantize(&x[..t * k], t, k)).collect();
        for format in [QFormat::Q4_0, QFormat::Q4_1, QFormat::Q8_0, QFormat::Q4_K, QFormat::Q6_K] {
            let w = QMatrix::quantize(format, n, k, &data(n * k, 7)).unwrap();
            // A cache lives no longer than the weights it packed (an engine's own).
            let cache = PanelCache::default();
            for isa in [Isa::best(), Isa::Scalar] {
                for (r0, count) in [(0, 16), (16, 16), (32, 16), (16, 32), (8, 16)] {
                    for xt in &tokens {
                        let want = i8_rows(isa, xt, w.view(), r0, count, None);
                        for _ in 0..2 {
                            // (Rows 16..48 from a slot that holds rows 16..32, and rows
                            // 8..24, not starting a block: packed anew.)
                            let kept = cache.weight(isa, w.view(), k);
                            let got = i8_rows(isa, xt, w.view(), r0, count, kept.as_ref());
                            assert!(
                                got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{format:?} {isa:?} rows {r0}.., {} tokens",
                                xt.m
                            );
                        }
                    }
                }
            }
            // A slot packed for more rows serves fewer from its first (a prompt's
            // tasks of 48 rows, then a decode batch's of 16 and 32), the same
            // bits as those rows packed alone.
            let wider = PanelCache::default();
            for isa in [Isa::best(), Isa::Scalar] {
                for count in [48, 16, 32, 40, 48] {
                    let want = i8_rows(isa, &xp, w.view(), 0, count, None);
                    let packed = PACKED_ANEW.with(std::cell::Cell::get);
                    let got = i8_rows(isa, &xp, w.view(), 0, count, wider.weight(isa, w.view(), k).as_ref());
                    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{format:?} {isa:?} rows 0..{count} of 48");
                    assert_eq!(
                        PACKED_ANEW.with(std::cell::Cell::get),
                        packed,
                        "{format:?} {isa:?} rows 0..{count}: read from the kept panel"
                    );
                }
            }
            // Tasks of other sizes share the kept panels by position, whichever
            // packed them: a decode batch's tasks of 16 rows at rows 16 and 32
            // read a prompt's panel of rows 0..48 from its second and third
            // blocks, and a prompt's task of 48 rows after a decode batch's
            // tasks of 16 reads their three panels; nothing packs again.
            for (first, then) in
                [(&[(0, 48)][..], &[(16, 16), (32, 16), (16, 32), (0, 48)][..]), (&[(0, 16), (16, 16), (32, 16)], &[(0, 48), (16, 32)])]
            {
                for isa in [Isa::best(), Isa::Scalar] {
                    let shared = PanelCache::default();
                    for &(r0, count) in first {
                        i8_rows(isa, &xp, w.view(), r0, count, shared.weight(isa, w.view(), k).as_ref());
                    }
                    let bytes = shared.bytes();
                    for &(r0, count) in then {
                        let want = i8_rows(isa, &xp, w.view(), r0, count, None);
                        let packed = PACKED_ANEW.with(std::cell::Cell::get);
                        let got = i8_rows(isa, &xp, w.view(), r0, count, shared.weight(isa, w.view(), k).as_ref());
                        assert!(
                            got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{format:?} {isa:?} rows {r0}+{count} after {first:?}"
                        );
                        assert_eq!(
                            PACKED_ANEW.with(std::cell::Cell::get),
                            packed,
                            "{format:?} {isa:?} rows {r0}+{count} after {first:?}: packed anew"
                        );
                        assert_eq!(shared.bytes(), bytes, "{format:?} {isa:?} rows {r0}+{count} after {first:?}: a second copy kept");
                    }
                }
            }
            // The 32-element formats' kept scales are halves (their own f16
            // numbers) where the SIMD tiles read them, the K formats' f32 (a
            // super-block scale times a small integer is not a half in
            // general); the portable loops' panels keep f32 scales.
            let halves = cache.panels.lock().unwrap().values().flat_map(|s| s.iter().filter_map(|p| p.get())).any(|p| p.halves.is_some());
            let simd = i8_gemm_simd(Isa::best());
            assert_eq!(halves, simd && matches!(format, QFormat::Q4_0 | QFormat::Q4_1 | QFormat::Q8_0), "{format:?}");
            assert!(cache.bytes() > 0);
        }
    }
}
