//! Block-format (quantized) dot products of the CPU layer, the dispatch: a decode
//! dot of f32 or int8-block activations with rows of ggml blocks read straight from
//! the quants ([`dot_q`], [`dot_q_i8`], portable fallback), SIMD dequantization, the
//! decode activation vector a kernel's `act_bits` asks for ([`ActVec`]), and the
//! `act_bits` / `rows_per_pass` parameters and the validity rule of every CPU
//! block-format kernel. The parts: `xq8` (activations quantized to int8 blocks),
//! `rows` (row access and the "dequantize a few weight rows once, dot them with
//! every token" step the prefill kernels share) and `x86/` (the AVX2 / AVX-512 VNNI
//! loops: per-format dots, the int8 and K-quant loop families, unpacking).

mod rows;
#[cfg(target_arch = "x86_64")]
mod x86;
mod xq8;

use super::Isa;
use crate::device::CpuCaps;
use crate::kernels::contract::{KernelError, ParamSpec, Params, check_blocks, param};
use crate::kernels::problem::Problem;
use crate::kernels::quant::DType;
use crate::kernels::quant::block::{F32Dot, I8Dot};
use crate::kernels::quant::{GROUP, Layout, QFormat, QK, QK_K, QView, Unpacked, dequantize_block, unpack};

pub use rows::{par_row_blocks, qin, qrow, row_blocks, rows_times_tokens, rows_times_vectors, token_vectors};
pub use xq8::XQ8;
pub(super) use xq8::{quantize_row, reserve_spares};

/// The activation scales a block tries (or a super-block that shares one), as
/// multiples of `max|x| / 127` (llama.cpp's scale, the first). Each is at least
/// that, so no code passes 127. Rounding to nearest at a fixed step leaves an
/// error that depends on where the values fall between the steps: of these
/// four steps, [`xq8::block_scale`] keeps the one whose codes give the values back
/// with the least squared error, about 14% less than `max|x| / 127` alone on
/// Gaussian or uniform blocks of 32 (4% on super-blocks of 256), for the price
/// of four error sums a block (in one pass over it).
const SCALE_STEPS: [f32; 4] = [1.0, 1.008, 1.016, 1.024];

/// `act_bits`: f32 activations, or int8 ones (see [`verify::tolerance_for`](crate::kernels::verify::tolerance_for)).
pub const ACT_BITS: ParamSpec = ParamSpec {
    name: "act_bits",
    values: &[32, 8],
    default: 32,
    help: "activations: 32 f32 (exact dot with the dequantized weights), 8 int8 blocks of 32 with integer dot products \
           (llama.cpp's q8 activations: about 0.5% error, far fewer instructions per weight)",
};
/// The parameters of the kernels that give a few tokens the decode GEMV's dots
/// ([`rows_times_vectors`]: `gemm_q_dots_cpu`, `gate_up_q_dots_cpu`); int8
/// activations by default, as the decode's.
pub const DOT_ROWS_PARAMS: &[ParamSpec] = &[super::ROWS_PER_TASK, super::ISA, ParamSpec { default: 8, ..ACT_BITS }, ROWS_PER_PASS];
/// `rows_per_pass`: with int8 activations, weight rows per pass over the activation blocks.
pub const ROWS_PER_PASS: ParamSpec = ParamSpec {
    name: "rows_per_pass",
    values: &[1, 4],
    default: 1,
    help: "weight rows dotted per pass over the int8 activation blocks (act_bits 8): 4 loads each activation block once for \
           four rows and keeps four accumulator chains (measured: q4_1 +38%, q8_0 -10% single-threaded on AVX2)",
};

/// CPU block-format kernels: the `isa` level, `rows_per_pass` 4 only with int8
/// activations, and k in whole blocks.
pub fn check_quant(_: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    Isa::param_available(param(params, "isa")?)?;
    if params.get("rows_per_pass").is_some_and(|&r| r != 1) {
        if params.get("act_bits") != Some(&8) {
            return Err("rows_per_pass 4 needs int8 activations (act_bits 8)".into());
        }
        if !dtype.quant().is_some_and(direct_i8) {
            let direct: Vec<_> = QFormat::ALL.into_iter().filter(|&f| direct_i8(f)).map(QFormat::name).collect();
            return Err(format!("rows_per_pass 4 has a path for the 32-element formats ({}) only, not {dtype}", direct.join(", ")));
        }
    }
    check_blocks(prob, dtype)
}

/// Whether `format` has dedicated f32-activation loops (dot, dequantize): its
/// type names an [`F32Dot`] other than [`F32Dot::Unpacked`].
pub fn four_row_path(format: QFormat) -> bool {
    format.ops().cpu.f32_dot != F32Dot::Unpacked
}

/// Whether `format` has the direct int8-activation block dot (values straight
/// into registers, eight blocks' scales a step) and the four-row pass
/// (`rows_per_pass` 4): its type names [`I8Dot::Direct`] (the 32-element formats).
pub fn direct_i8(format: QFormat) -> bool {
    format.ops().cpu.i8_dot == I8Dot::Direct
}

/// One block's int8 values, scales and offsets ([`unpack`]), through AVX2 where
/// `isa` allows.
pub fn unpack_fast(isa: Isa, format: QFormat, q: &[u8], s: &[half::f16], u: &mut Unpacked) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: AVX2 checked.
        unsafe { x86::unpack_simd(format, q, s, u) };
        return;
    }
    let _ = isa;
    unpack(format, q, s, u);
}

/// `Σ x[i] * w[i]` where `w` is the dequantized view (`x.len()` = `w.elems()`).
pub fn dot_q(isa: Isa, x: &[f32], w: QView<'_>) -> f32 {
    let blocks = w.blocks().min(x.len() / w.format.block_elems());
    let w = w.blocks_range(0, blocks);
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx2() {
            // SAFETY: `isa.avx2()` checked AVX2, FMA and F16C; lengths are whole blocks of `x`.
            return unsafe {
                match w.format.ops().cpu.f32_dot {
                    F32Dot::Bytes => x86::dot_q8_0(x, w.quants, w.scales),
                    F32Dot::Nibbles => x86::dot_q4_0(x, w.quants, w.scales),
                    F32Dot::NibblesMin => x86::dot_q4_1(x, w.quants, w.scales),
                    F32Dot::Unpacked => x86::dot_unpacked(x, w),
                }
            };
        }
    }
    let _ = isa;
    dot_q_scalar(x, w)
}

/// `Σ x[i] * w[i]` with `x` as int8 blocks: integer dot products per block, scaled
/// by both blocks' scales (and the q4 offsets through `Σ q`).
pub fn dot_q_i8(isa: Isa, x: &XQ8, w: QView<'_>) -> f32 {
    let per = w.format.block_elems() / QK;
    let blocks = w.blocks().min(x.d.len() / per);
    let w = w.blocks_range(0, blocks);
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx2() {
            // SAFETY: `isa.avx2()` checked AVX2, FMA and F16C; `x` holds `blocks` blocks.
            return unsafe {
                match (w.format.ops().cpu.i8_dot, isa.vnni()) {
                    // One activation scale per super-block: whole super-blocks summed
                    // in integers (llama.cpp's q4_K x q8_K).
                    (I8Dot::SuperQ4K, true) if x.per256 => x86::kq8_vnni::dot_q4k(w.quants, w.scales, x),
                    (I8Dot::SuperQ6K, true) if x.per256 => x86::kq8_vnni::dot_q6k(w.quants, w.scales, x),
                    (I8Dot::SuperQ4K, false) if x.per256 => x86::kq8_avx2::dot_q4k(w.quants, w.scales, x),
                    (I8Dot::SuperQ6K, false) if x.per256 => x86::kq8_avx2::dot_q6k(w.quants, w.scales, x),
                    // SAFETY (vnni): `isa.vnni()` checked AVX-512F/BW/VL/VNNI too.
                    (I8Dot::Direct, true) => x86::vnni::dot_i8(w.format, w.quants, w.scales, x),
                    (I8Dot::Direct, false) => x86::avx2::dot_i8(w.format, w.quants, w.scales, x),
                    (I8Dot::SuperQ4K | I8Dot::SuperQ6K | I8Dot::Unpacked, _) => x86::dot_i8_unpacked(x, w),
                }
            };
        }
    }
    let _ = isa;
    let mut s = 0f32;
    let mut u = Unpacked::default();
    for b in 0..blocks {
        let (q, sc) = w.block(b);
        unpack(w.format, q, sc, &mut u);
        for g in 0..w.format.block_elems() / GROUP {
            let xb = (b * per) + g / 2;
            let xq = &x.q[(b * per) * QK + g * GROUP..][..GROUP];
            let dot: i32 = u.vals[g * GROUP..(g + 1) * GROUP].iter().zip(xq).map(|(&a, &c)| a as i32 * c as i32).sum();
            s += u.scale[g] * x.d[xb] * dot as f32 + u.off[g] * x.dsum16[2 * xb + g % 2];
        }
    }
    s
}

/// Whether int8 dots with `format` weights take activations with one scale per
/// 256 ([`XQ8::quantize_k`]): the formats whose type names a super-block int8
/// dot ([`I8Dot::per256`]: Q4_K, Q6_K) on a CPU with AVX2.
pub fn per256_dots(format: QFormat) -> bool {
    #[cfg(target_arch = "x86_64")]
    return format.ops().cpu.i8_dot.per256() && Isa::best().avx2();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = format;
        false
    }
}

/// A decode activation vector as a kernel's `act_bits` asks: f32, or int8 blocks.
pub enum ActVec<'a> {
    F32(&'a [f32]),
    I8(XQ8),
}

impl<'a> ActVec<'a> {
    /// `x` for dots with weights of `format`: with `act_bits 8`, int8 blocks, with
    /// one scale per super-block for the K-quants whose dots sum super-blocks in
    /// integers on x86 (as llama.cpp quantizes their activations, q8_K).
    pub fn new(x: &'a [f32], params: &Params, format: QFormat) -> Result<ActVec<'a>, KernelError> {
        Ok(if param(params, "act_bits")? == 8 {
            ActVec::I8(if per256_dots(format) { XQ8::quantize_k(x) } else { XQ8::quantize(x) })
        } else {
            ActVec::F32(x)
        })
    }
    #[inline]
    pub fn dot(&self, isa: Isa, w: QView<'_>) -> f32 {
        match self {
            ActVec::F32(x) => dot_q(isa, x, w),
            ActVec::I8(x) => dot_q_i8(isa, x, w),
        }
    }
    /// Rows `first..first + y.len()` of `w` (`k` columns) dotted with this vector
    /// into `y`; with `four`, int8 activations take four rows per pass on AVX2.
    pub fn rows(&self, isa: Isa, w: QView<'_>, k: usize, first: usize, y: &mut [f32], four: bool) {
        if let Layout::X8 { .. } = w.layout {
            // 8 rows a pass straight from the records, whichever the activations.
            match self {
                ActVec::I8(x) => super::qx8::rows_x8(isa, x, w, first, y),
                ActVec::F32(x) => super::qx8::rows_x8_f32(isa, x, w, first, y),
            }
            return;
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = four;
        #[cfg(target_arch = "x86_64")]
        if let ActVec::I8(x) = self
            && four
            && isa.avx2()
            && x.d.len() * QK >= k
            && direct_i8(w.format)
        {
            let mut i = 0;
            while i + 4 <= y.len() {
                let r: [QView<'_>; 4] = std::array::from_fn(|j| qrow(w, first + i + j, k));
                // SAFETY: AVX2/FMA/F16C checked; each row holds k / 32 blocks, as x does (or more).
                let (q, s) = (r.map(|v| v.quants), r.map(|v| v.scales));
                // SAFETY (vnni): `isa.vnni()` checked AVX-512F/BW/VL/VNNI too.
                let out =
                    unsafe { if isa.vnni() { x86::vnni::dot_i8_x4(w.format, q, s, x) } else { x86::avx2::dot_i8_x4(w.format, q, s, x) } };
                y[i..i + 4].copy_from_slice(&out);
                i += 4;
            }
            for (j, out) in y[i..].iter_mut().enumerate() {
                *out = self.dot(isa, qrow(w, first + i + j, k));
            }
            return;
        }
        for (i, out) in y.iter_mut().enumerate() {
            *out = self.dot(isa, qrow(w, first + i, k));
        }
    }
}

/// Portable block-by-block dot product.
pub fn dot_q_scalar(x: &[f32], w: QView<'_>) -> f32 {
    let be = w.format.block_elems();
    let mut tmp = [0f32; QK_K];
    let mut s = 0f32;
    for b in 0..w.blocks() {
        let (q, sc) = w.block(b);
        dequantize_block(w.format, q, sc, &mut tmp[..be]);
        s += super::dot::dot_f32_scalar(&x[b * be..(b + 1) * be], &tmp[..be]);
    }
    s
}

/// Row `r` (of `k` columns) of `w` dequantized into `out`, whatever its layout.
pub fn dequantize_row(isa: Isa, w: QView<'_>, r: usize, k: usize, out: &mut [f32]) {
    let Layout::X8 { bpr } = w.layout else { return dequantize(isa, qrow(w, r, k), out) };
    for (c, o) in out.chunks_exact_mut(w.format.block_elems()).take(bpr).enumerate() {
        w.with_block(r * bpr + c, |q, s| dequantize(isa, QView { format: w.format, quants: q, scales: s, layout: Layout::Rows }, o));
    }
}

/// Dequantizes a view into `out` (SIMD where available).
pub fn dequantize(isa: Isa, w: QView<'_>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx2() {
            let be = w.format.block_elems();
            let blocks = w.blocks().min(out.len() / be);
            let w = w.blocks_range(0, blocks);
            // SAFETY: as in `dot_q`; `out` holds `blocks * block_elems` values.
            unsafe {
                if four_row_path(w.format) {
                    x86::dequantize(w.format, w.quants, w.scales, &mut out[..blocks * be])
                } else {
                    x86::dequantize_unpacked(w, &mut out[..blocks * be])
                }
            };
            return;
        }
    }
    let _ = isa;
    w.dequantize_into(out);
}

#[cfg(test)]
mod tests {
    use super::xq8::{block_scale, quantize_block};
    use super::*;
    use crate::kernels::quant::QMatrix;

    fn data(n: usize, seed: u64) -> Vec<f32> {
        super::super::testdata::signed(n, seed)
    }

    #[test]
    fn simd_and_scalar_block_dots_agree_with_dequantized_dots() {
        let (rows, k) = (5, 256 * 3);
        let x = data(k, 1);
        for f in QFormat::ALL {
            let m = QMatrix::quantize(f, rows, k, &data(rows * k, 2)).unwrap();
            let deq = m.dequantize();
            for r in 0..rows {
                let want: f64 = (0..k).map(|i| x[i] as f64 * deq[r * k + i] as f64).sum();
                for isa in [Isa::Scalar, Isa::best()] {
                    let got = dot_q(isa, &x, qrow(m.view(), r, k));
                    assert!((got as f64 - want).abs() < 1e-4 * (1.0 + want.abs()), "{f} {isa:?} row {r}: {got} vs {want}");
                }
                let mut out = vec![0f32; k];
                dequantize(Isa::best(), qrow(m.view(), r, k), &mut out);
                for (a, b) in out.iter().zip(&deq[r * k..(r + 1) * k]) {
                    // q4_1's q * d + m is one fused rounding in SIMD, two in scalar.
                    assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{f} SIMD dequantize row {r}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn simd_activation_quantization_gives_the_scalar_scales_and_codes() {
        // Random blocks, a block of exact ties (x/d = k + 0.5), a zero block, and
        // super-blocks of 256 (one scale for 8 blocks).
        let mut blocks: Vec<Vec<f32>> = (0..20).map(|i| data(32, 100 + i)).collect();
        blocks.push((0..32).map(|j| if j == 0 { 127.0 } else { (j as f32 - 16.0) + 0.5 }).collect());
        blocks.push(vec![0.0; 32]);
        blocks.extend((0..4).map(|i| data(256, 200 + i)));
        for (n, xs) in blocks.iter().enumerate() {
            let d = block_scale(xs);
            #[cfg(target_arch = "x86_64")]
            if Isa::best().avx2() {
                // SAFETY: AVX2 and FMA checked; a multiple of 16 values.
                let dv = unsafe { x86::block_scale(xs) };
                assert_eq!(dv.to_bits(), d.to_bits(), "block {n}: AVX2 scale");
            }
            #[cfg(target_arch = "x86_64")]
            if Isa::best() == Isa::Avx512 {
                // SAFETY: AVX-512F checked; a multiple of 16 values.
                let dv = unsafe { x86::block_scale_avx512(xs) };
                assert_eq!(dv.to_bits(), d.to_bits(), "block {n}: AVX-512 scale");
            }
            for xb in xs.chunks_exact(32) {
                let (mut a, mut b) = ([0i8; 32], [0i8; 32]);
                let want = quantize_block(xb, &mut a, d);
                #[cfg(target_arch = "x86_64")]
                if Isa::best().avx2() {
                    // SAFETY: AVX2 checked.
                    let got = unsafe { x86::quantize_block(xb, &mut b, d) };
                    assert_eq!((got, b), (want, a), "block {n}: AVX2 codes");
                }
                #[cfg(target_arch = "x86_64")]
                if Isa::best() == Isa::Avx512 {
                    b = [0; 32];
                    // SAFETY: AVX-512F checked.
                    let got = unsafe { x86::quantize_block_avx512(xb, &mut b, d) };
                    assert_eq!((got, b), (want, a), "block {n}: AVX-512 codes");
                }
                let _ = &mut b;
            }
            // One block searched and quantized in one call.
            #[cfg(target_arch = "x86_64")]
            if Isa::best() == Isa::Avx512 && xs.len() == 32 {
                let (mut a, mut b) = ([0i8; 32], [1i8; 32]);
                let want = quantize_block(xs, &mut a, d);
                // SAFETY: AVX-512F checked; 32 values.
                let (dv, got) = unsafe { x86::scale_and_quantize_avx512(xs, &mut b) };
                assert_eq!((dv.to_bits(), got, b), (d.to_bits(), want, a), "block {n}: AVX-512 scale and codes in one go");
            }
        }
        // Four blocks a call, every run of four consecutive blocks of 32 above
        // (the ties and the zero block among them, at each place of the four),
        // and blocks of one magnitude where candidates may tie.
        #[cfg(target_arch = "x86_64")]
        if Isa::best() == Isa::Avx512 {
            let mut all: Vec<f32> = blocks.concat();
            all.extend((0..4 * 32).map(|i| if i % 3 == 0 { 1.0 } else { -1.0 }));
            all.extend([0.0f32; 4 * 32]);
            for start in (0..all.len() / 32 - 3).map(|b| 32 * b) {
                let xs = &all[start..start + 128];
                let (mut got_q, mut want_q) = ([1i8; 128], [0i8; 128]);
                // SAFETY: AVX-512F checked; 128 values.
                let (d, s) = unsafe { x86::scale_and_quantize4_avx512(xs, &mut got_q) };
                for i in 0..4 {
                    let xb = &xs[32 * i..32 * i + 32];
                    let want_d = block_scale(xb);
                    let want_s = quantize_block(xb, &mut want_q[32 * i..32 * i + 32], want_d);
                    assert_eq!(
                        (d[i].to_bits(), s[i]),
                        (want_d.to_bits(), want_s),
                        "blocks from {start}: block {i} of four, scale and sums"
                    );
                }
                assert_eq!(got_q, want_q, "blocks from {start}: codes of four");
            }
        }
    }

    /// `x` as int8 blocks of 32 at the scales `scale` picks for each block.
    fn xq8_at(x: &[f32], scale: impl Fn(&[f32]) -> f32) -> XQ8 {
        let mut xq = XQ8 { q: vec![0; x.len()], d: vec![], dsum: vec![], dsum16: vec![], per256: false };
        for (xb, qb) in x.chunks_exact(QK).zip(xq.q.chunks_exact_mut(QK)) {
            let d = scale(xb);
            let s = quantize_block(xb, qb, d);
            xq.d.push(d);
            xq.dsum.push(d * (s[0] + s[1]) as f32);
            xq.dsum16.extend([d * s[0] as f32, d * s[1] as f32]);
        }
        xq
    }

    #[test]
    fn activation_scales_give_the_values_and_the_dots_back_closer_than_max_over_127() {
        // The witness of the scale search: llama.cpp's `max|x| / 127` alone (what
        // XQ8 used before) against the scale of least squared error, on uniform
        // blocks and heavier-tailed ones (cubes), in f64.
        let uni = data(32 * 256, 31);
        let cubes: Vec<f32> = data(32 * 256, 32).iter().map(|v| v * v * v).collect();
        let max127 = |xb: &[f32]| xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        let err = |x: &[f32], xq: &XQ8| -> f64 {
            x.iter().enumerate().map(|(i, &v)| (v as f64 - xq.d[i / QK] as f64 * xq.q[i] as f64).powi(2)).sum()
        };
        for (x, what) in [(&uni, "uniform"), (&cubes, "cubes")] {
            let (old, new) = (xq8_at(x, max127), XQ8::quantize(x));
            for b in 0..x.len() / QK {
                let blk = &x[b * QK..(b + 1) * QK];
                let one = |xq: &XQ8| err(blk, &xq8_at(blk, |_| xq.d[b]));
                assert!(one(&new) <= one(&old) * (1.0 + 1e-5), "{what} block {b}: a scale worse than max/127");
            }
            let (eo, en) = (err(x, &old), err(x, &new));
            assert!(en < 0.9 * eo, "{what}: squared error {en:e}, max/127 gives {eo:e}");
            // And so the dots: Q4_0 and Q8_0 rows, int8 dots against f64 ones with
            // the dequantized weights.
            let k = x.len();
            for f in [QFormat::Q4_0, QFormat::Q8_0] {
                let m = QMatrix::quantize(f, 8, k, &data(8 * k, 33)).unwrap();
                let deq = m.dequantize();
                let (mut so, mut sn) = (0f64, 0f64);
                for r in 0..8 {
                    let exact: f64 = (0..k).map(|i| x[i] as f64 * deq[r * k + i] as f64).sum();
                    so += (dot_q_i8(Isa::best(), &old, qrow(m.view(), r, k)) as f64 - exact).powi(2);
                    sn += (dot_q_i8(Isa::best(), &new, qrow(m.view(), r, k)) as f64 - exact).powi(2);
                }
                assert!(sn < so, "{what} {f}: squared dot error {sn:e}, with max/127 {so:e}");
            }
        }
    }

    #[test]
    fn int8_block_dots_of_the_32_element_formats_take_eight_blocks_a_step_and_a_tail() {
        // 11 blocks: one step of eight blocks (vector scales) and a tail of three.
        let k = 32 * 11;
        let x = data(k, 7);
        let xq = XQ8::quantize(&x);
        for f in QFormat::ALL.into_iter().filter(|&f| direct_i8(f)) {
            let m = QMatrix::quantize(f, 5, k, &data(5 * k, 8)).unwrap();
            let mut four = vec![0f32; 5];
            ActVec::I8(XQ8::quantize(&x)).rows(Isa::best(), m.view(), k, 0, &mut four, true);
            for (r, &fr) in four.iter().enumerate() {
                let s = dot_q_i8(Isa::Scalar, &xq, qrow(m.view(), r, k));
                let v = dot_q_i8(Isa::best(), &xq, qrow(m.view(), r, k));
                assert!((s - v).abs() <= 1e-4 * (1.0 + s.abs()), "{f} row {r}: scalar {s} vs SIMD {v}");
                assert!((fr - v).abs() <= 1e-5 * (1.0 + v.abs()), "{f} row {r}: four-row {fr} vs one-row {v}");
            }
        }
    }

    #[test]
    fn vnni_int8_dots_equal_the_avx2_ones_bit_for_bit() {
        // The same integer sums by four (vpdpbusd against maddubs + madd), so the
        // same floats; one row, four rows, a tail, and Q8_0 codes of -128 and 127.
        if !Isa::best().vnni() {
            eprintln!("SKIPPED: this CPU has no AVX-512 VNNI (the AVX2 dots serve); nothing to compare");
            return;
        }
        let k = 32 * 11;
        let x = data(k, 9);
        let xq = XQ8::quantize(&x);
        for f in QFormat::ALL.into_iter().filter(|&f| direct_i8(f)) {
            let mut m = QMatrix::quantize(f, 6, k, &data(6 * k, 10)).unwrap();
            if f == QFormat::Q8_0 {
                for (i, q) in m.quants.iter_mut().enumerate().take(64) {
                    *q = if i % 2 == 0 { 0x80 } else { 0x7f };
                }
            }
            let (mut v4, mut a4) = (vec![0f32; 6], vec![0f32; 6]);
            ActVec::I8(XQ8::quantize(&x)).rows(Isa::best(), m.view(), k, 0, &mut v4, true);
            ActVec::I8(XQ8::quantize(&x)).rows(Isa::Simd256, m.view(), k, 0, &mut a4, true);
            assert_eq!(v4, a4, "{f}: four-row pass");
            for r in 0..6 {
                let v = dot_q_i8(Isa::best(), &xq, qrow(m.view(), r, k));
                let a = dot_q_i8(Isa::Simd256, &xq, qrow(m.view(), r, k));
                let s = dot_q_i8(Isa::Scalar, &xq, qrow(m.view(), r, k));
                assert_eq!(v.to_bits(), a.to_bits(), "{f} row {r}: vnni {v} avx2 {a}");
                assert!((v - s).abs() <= 1e-4 * (1.0 + s.abs()), "{f} row {r}: vnni {v} scalar {s}");
            }
        }
        // The K-quant dots on one scale per super-block: vpdpwssd against madd + add.
        let k = 256 * 3;
        let x = data(k, 11);
        let xk = XQ8::quantize_k(&x);
        for f in [QFormat::Q4_K, QFormat::Q6_K] {
            let m = QMatrix::quantize(f, 4, k, &data(4 * k, 12)).unwrap();
            for r in 0..4 {
                let v = dot_q_i8(Isa::best(), &xk, qrow(m.view(), r, k));
                let a = dot_q_i8(Isa::Simd256, &xk, qrow(m.view(), r, k));
                assert_eq!(v.to_bits(), a.to_bits(), "{f} row {r} (per 256): vnni {v} avx2 {a}");
            }
        }
    }

    #[test]
    fn int8_activation_dots_agree_scalar_simd_and_stay_close() {
        let (rows, k) = (6, 256 * 2);
        let x = data(k, 5);
        // Both activation forms: a scale per 32, and one per 256 (q8_K: what the
        // K-quant dots sum in integers), each against the portable loop.
        for (xq, what) in [(XQ8::quantize(&x), "per 32"), (XQ8::quantize_k(&x), "per 256")] {
            activation_dots_close(&x, &xq, rows, k, what);
        }
        let xk = XQ8::quantize_k(&x);
        assert!(xk.per256 && xk.d.chunks(8).all(|c| c.iter().all(|&d| d == c[0])), "one scale per super-block");
        // The shared scale is one of the super-block's candidates.
        let amax = x[..256].iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(SCALE_STEPS.iter().any(|s| xk.d[0] == amax / 127.0 * s), "{} from {amax}", xk.d[0]);
    }

    fn activation_dots_close(x: &[f32], xq: &XQ8, rows: usize, k: usize, what: &str) {
        for f in QFormat::ALL {
            let m = QMatrix::quantize(f, rows, k, &data(rows * k, 6)).unwrap();
            let deq = m.dequantize();
            for r in 0..rows {
                let exact: f64 = (0..k).map(|i| x[i] as f64 * deq[r * k + i] as f64).sum();
                let norm: f64 = (0..k).map(|i| (x[i] as f64 * deq[r * k + i] as f64).abs()).sum();
                let s = dot_q_i8(Isa::Scalar, xq, qrow(m.view(), r, k));
                let v = dot_q_i8(Isa::best(), xq, qrow(m.view(), r, k));
                assert!((s - v).abs() <= 1e-4 * (1.0 + s.abs()), "{f} row {r} ({what}): scalar {s} vs SIMD {v}");
                // int8 activations: error well under 1% of the absolute sum.
                assert!((v as f64 - exact).abs() <= 1e-2 * norm, "{f} row {r} ({what}): {v} vs {exact} (|sum| {norm})");
            }
            // The four-row pass gives each row's single-row result (rows 1..5: a group
            // of four and a tail); the other formats go row by row.
            let mut y = vec![0f32; rows - 1];
            let again = if xq.per256 { XQ8::quantize_k(x) } else { XQ8::quantize(x) };
            ActVec::I8(again).rows(Isa::best(), m.view(), k, 1, &mut y, true);
            for (i, &v) in y.iter().enumerate() {
                let one = dot_q_i8(Isa::best(), xq, qrow(m.view(), i + 1, k));
                assert!((v - one).abs() <= 1e-5 * (1.0 + one.abs()), "{f} row {}: four-row {v} vs one-row {one}", i + 1);
            }
        }
    }
}
