// Block decoding shared by the quantized shaders (qgemv_*, qgemm_tiled, qgate_up_wg,
// qqkv_proj_wg, norm_gemv_q_*): `shader!(FILE, "qblock.wgsl", "qgeom.wgsl", ..)`
// appends this file and the block geometry (qbe, qwpb, qspb, qhalf, qbits16) to
// each. It reads the including shader's `override QFMT: u32`, `wq` and `ws`
// bindings (array<u32>), and for `qdot` its `x: array<vec4<f32>>`.
//
// QFMT (kernels::wgsl::qfmt, the order of QFormat::ALL): 0 q8_0, 1 q4_0, 2 q4_1,
// 3 q5_0, 4 q5_1, 5 q2_k, 6 q3_k, 7 q4_k, 8 q5_k, 9 q6_k, 10 iq4_nl, 11 iq4_xs.
// wq: every block's bytes except its 16-bit header fields, qwpb() words a block
// (the GPU layout of kernels::quant::QMatrix, QFormat::gpu_block: q3_k padded to
// whole 16-byte words; q4_k / q5_k's sub-block scales then minima a byte each in
// bytes 0..16, their qh / qs after); ws: the header fields, qspb() a
// block, two to a word (d; d, m; d, dmin; iq4_xs d, scales_h).
//
// A block is read in units: qunits() per block, each one quant word's worth of
// values, 4 (q8_0) or 8 (4 at element offset qpos(j).x of the block, 4 at
// qpos(j).y), so the units of a block cover each of its elements once. The element
// mapping follows ggml's layouts (kernels/quant/decode.rs is the reference).

// Units per block.
fn qunits() -> u32 {
    if (QFMT == 0u) {
        return 8u;
    }
    return qbe() / 8u;
}

// Scale d and offset m (0 unless q4_1 / q5_1) of a 32-element block b.
fn qscale(b: u32) -> vec2<f32> {
    if (QFMT == 2u || QFMT == 4u) {
        return vec2<f32>(qhalf(b, 0u), qhalf(b, 1u));
    }
    return vec2<f32>(qhalf(b, 0u), 0.0);
}

// The quant word at byte offset `off` (a multiple of 4) of block b, and one byte.
fn qw4(b: u32, off: u32) -> u32 {
    return wq[b * qwpb() + (off >> 2u)];
}

fn qbyte(b: u32, off: u32) -> u32 {
    return (qw4(b, off & ~3u) >> ((off & 3u) * 8u)) & 0xffu;
}

fn nib_lo(w: u32) -> vec4<u32> {
    return (vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u);
}

fn nib_hi(w: u32) -> vec4<u32> {
    return (vec4<u32>(w) >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u);
}

fn bytes4(w: u32) -> vec4<u32> {
    return (vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u);
}

// The IQ4 levels of four nibbles.
fn iq4(n: vec4<u32>) -> vec4<f32> {
    var lut = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                             1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);
    return vec4<f32>(lut[n.x], lut[n.y], lut[n.z], lut[n.w]);
}

// Q4_K / Q5_K: the scales and minimums of sub-blocks g and g + 1 (g even) of
// block b, (sc g, m g, sc g+1, m g+1): bytes g, g + 1 of the block's unpacked
// scales (bytes 0..8) and minima (8..16), two loads.
fn scale_min_k4_pair(b: u32, g: u32) -> vec4<f32> {
    let sh = 8u * (g % 4u);
    let s = qw4(b, 4u * (g / 4u)) >> sh;
    let m = qw4(b, 8u + 4u * (g / 4u)) >> sh;
    return vec4<f32>(f32(s & 255u), f32(m & 255u), f32((s >> 8u) & 255u), f32((m >> 8u) & 255u));
}

// Q3_K: the signed 6-bit scale of group g (0..16) of block b (its scales at byte 96).
fn scale_q3k(b: u32, g: u32) -> f32 {
    let lo = select(qbyte(b, 96u + g - 8u) >> 4u, qbyte(b, 96u + g) & 15u, g < 8u);
    let hi = (qbyte(b, 104u + g % 4u) >> (2u * (g / 4u))) & 3u;
    return f32(i32(lo | (hi << 4u)) - 32);
}

// Element offsets in its block of unit j's two halves.
fn qpos(j: u32) -> vec2<u32> {
    switch QFMT {
        case 0u: { return vec2<u32>(4u * j, 4u * j); }
        case 5u, 6u: {
            let lo = 128u * (j / 16u) + 64u * ((j / 8u) % 2u) + 4u * (j % 8u);
            return vec2<u32>(lo, lo + 32u);
        }
        case 7u, 8u: {
            let lo = 64u * (j / 8u) + 4u * (j % 8u);
            return vec2<u32>(lo, lo + 32u);
        }
        case 9u: {
            let lo = 128u * (j / 16u) + 32u * ((j / 8u) % 2u) + 4u * (j % 8u);
            return vec2<u32>(lo, lo + 64u);
        }
        case 11u: {
            let lo = 32u * (j / 4u) + 4u * (j % 4u);
            return vec2<u32>(lo, lo + 16u);
        }
        default: { return vec2<u32>(4u * j, 16u + 4u * j); }
    }
}

// The units holding elements 32 * ci .. 32 * ci + 32 of a block (a 32-element
// chunk, what the tiled GEMM stages per step): the first, how many, and which of
// their halves fall in it (0 .lo, 1 .hi, 2 both).
fn qchunk(ci: u32) -> vec3<u32> {
    switch QFMT {
        case 0u: { return vec3<u32>(0u, 8u, 0u); }
        case 5u, 6u: { return vec3<u32>(16u * (ci / 4u) + 8u * ((ci % 4u) / 2u), 8u, ci % 2u); }
        case 7u, 8u: { return vec3<u32>(8u * (ci / 2u), 8u, ci % 2u); }
        case 9u: { return vec3<u32>(16u * (ci / 4u) + 8u * (ci % 2u), 8u, (ci % 4u) / 2u); }
        case 11u: { return vec3<u32>(4u * ci, 4u, 2u); }
        default: { return vec3<u32>(0u, 4u, 2u); }
    }
}

// Unit gu (global: block gu / qunits(), unit gu % qunits()) dequantized: the values
// at qpos(j).x in .lo and at qpos(j).y in .hi (q8_0: .lo only).
struct QWord { lo: vec4<f32>, hi: vec4<f32> }

fn qdecode(gu: u32) -> QWord {
    let b = gu / qunits();
    let j = gu % qunits();
    switch QFMT {
        case 0u: {
            let v = (vec4<i32>(bitcast<i32>(qw4(b, 4u * j))) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u);
            return QWord(vec4<f32>(v) * qhalf(b, 0u), vec4<f32>(0.0));
        }
        case 1u, 2u, 10u: {
            let w = qw4(b, 4u * j);
            let sc = qscale(b);
            if (QFMT == 10u) {
                return QWord(iq4(nib_lo(w)) * sc.x, iq4(nib_hi(w)) * sc.x);
            }
            let lo = vec4<f32>(nib_lo(w));
            let hi = vec4<f32>(nib_hi(w));
            if (QFMT == 1u) {
                return QWord((lo - 8.0) * sc.x, (hi - 8.0) * sc.x);
            }
            return QWord(lo * sc.x + sc.y, hi * sc.x + sc.y);
        }
        case 3u, 4u: {
            let qh = qw4(b, 0u);
            let w = qw4(b, 4u + 4u * j);
            let sh = vec4<u32>(0u, 1u, 2u, 3u) + 4u * j;
            let lo = vec4<f32>(nib_lo(w) | (((vec4<u32>(qh) >> sh) & vec4<u32>(1u)) << vec4<u32>(4u)));
            let hi = vec4<f32>(nib_hi(w) | (((vec4<u32>(qh) >> (sh + 16u)) & vec4<u32>(1u)) << vec4<u32>(4u)));
            let sc = qscale(b);
            if (QFMT == 3u) {
                return QWord((lo - 16.0) * sc.x, (hi - 16.0) * sc.x);
            }
            return QWord(lo * sc.x + sc.y, hi * sc.x + sc.y);
        }
        case 5u, 6u: {
            let h = j / 16u;
            let sp = (j / 8u) % 2u;
            let w = j % 8u;
            let qoff = select(16u, 32u, QFMT == 6u) + 32u * h + 4u * w;
            let q = bytes4(qw4(b, qoff));
            let s0 = 2u * sp;
            var lo = vec4<f32>((q >> vec4<u32>(2u * s0)) & vec4<u32>(3u));
            var hi = vec4<f32>((q >> vec4<u32>(2u * s0 + 2u)) & vec4<u32>(3u));
            let g = 8u * h + 4u * sp + w / 4u;
            let d = qhalf(b, 0u);
            if (QFMT == 5u) {
                let dmin = qhalf(b, 1u);
                let s_lo = qbyte(b, g);
                let s_hi = qbyte(b, g + 2u);
                return QWord(lo * (d * f32(s_lo & 15u)) - dmin * f32(s_lo >> 4u),
                             hi * (d * f32(s_hi & 15u)) - dmin * f32(s_hi >> 4u));
            }
            let hm = bytes4(qw4(b, 4u * w));
            let bit = 4u * h + s0;
            lo -= select(vec4<f32>(4.0), vec4<f32>(0.0), ((hm >> vec4<u32>(bit)) & vec4<u32>(1u)) == vec4<u32>(1u));
            hi -= select(vec4<f32>(4.0), vec4<f32>(0.0), ((hm >> vec4<u32>(bit + 1u)) & vec4<u32>(1u)) == vec4<u32>(1u));
            return QWord(lo * (d * scale_q3k(b, g)), hi * (d * scale_q3k(b, g + 2u)));
        }
        case 7u, 8u: {
            let jj = j / 8u;
            let w = j % 8u;
            let qoff = select(16u, 48u, QFMT == 8u) + 32u * jj + 4u * w;
            let q = qw4(b, qoff);
            var lo = nib_lo(q);
            var hi = nib_hi(q);
            let g = 2u * jj;
            if (QFMT == 8u) {
                let qh = bytes4(qw4(b, 16u + 4u * w));
                lo |= ((qh >> vec4<u32>(g)) & vec4<u32>(1u)) << vec4<u32>(4u);
                hi |= ((qh >> vec4<u32>(g + 1u)) & vec4<u32>(1u)) << vec4<u32>(4u);
            }
            // d and dmin: the block's one header word (qspb() = 2).
            let dm = unpack2x16float(ws[b]);
            let sm = scale_min_k4_pair(b, g);
            return QWord(vec4<f32>(lo) * (dm.x * sm.x) - dm.y * sm.y, vec4<f32>(hi) * (dm.x * sm.z) - dm.y * sm.w);
        }
        case 9u: {
            let h = j / 16u;
            let c = (j / 8u) % 2u;
            let w = j % 8u;
            let ql = qw4(b, 64u * h + 32u * c + 4u * w);
            let qh = bytes4(qw4(b, 128u + 32u * h + 4u * w));
            let lo = vec4<i32>(nib_lo(ql) | (((qh >> vec4<u32>(2u * c)) & vec4<u32>(3u)) << vec4<u32>(4u))) - 32;
            let hi = vec4<i32>(nib_hi(ql) | (((qh >> vec4<u32>(2u * c + 4u)) & vec4<u32>(3u)) << vec4<u32>(4u))) - 32;
            let g = (128u * h + 32u * c + 4u * w) / 16u;
            let s_lo = f32((i32(qbyte(b, 192u + g)) << 24u) >> 24u);
            let s_hi = f32((i32(qbyte(b, 192u + g + 4u)) << 24u) >> 24u);
            let d = qhalf(b, 0u);
            return QWord(vec4<f32>(lo) * (d * s_lo), vec4<f32>(hi) * (d * s_hi));
        }
        default: {
            // iq4_xs
            let ib = j / 4u;
            let w = j % 4u;
            let q = qw4(b, 4u + 16u * ib + 4u * w);
            let ls = ((qbyte(b, ib / 2u) >> (4u * (ib % 2u))) & 15u) | (((qbits16(b, 1u) >> (2u * ib)) & 3u) << 4u);
            let dl = qhalf(b, 0u) * f32(i32(ls) - 32);
            return QWord(iq4(nib_lo(q)) * dl, iq4(nib_hi(q)) * dl);
        }
    }
}

// Unit wi of a row whose units start at global unit `rw`, dotted with the
// activation row starting at vec4 index `xv`.
fn qdot(rw: u32, wi: u32, xv: u32) -> f32 {
    let qu = qunits();
    let base = xv + (wi / qu) * (qbe() / 4u);
    let p = qpos(wi % qu);
    let d = qdecode(rw + wi);
    if (QFMT == 0u) {
        return dot(d.lo, x[base + p.x / 4u]);
    }
    return dot(d.lo, x[base + p.x / 4u]) + dot(d.hi, x[base + p.y / 4u]);
}
