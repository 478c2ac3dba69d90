// The second-generation quantized projections' shared core (`shader!(head
// "qdp4a_head.wgsl"; FAMILY, MAIN, "qdp4a.wgsl", "qgeom.wgsl", ..)`, qgeom.wgsl the
// block geometry): the GEMV (gemv_q_dp4a_*, family qdp4a_gemv.wgsl), the fused gate+up (gate_up_q_dp4a_*, qdp4a_gate_up.wgsl) and
// the fused Q/K/V projection (qkv_proj_q_dp4a_*, qdp4a_qkv.wgsl); the entry `main`
// comes from qdp4a_main_wg.wgsl (workgroup tree) or qdp4a_main_sg.wgsl
// (subgroupAdd). Entry points over one set of bindings, each binding the subset
// it uses:
//
//   quantize    x -> xq, xs: the activation once per call, in ACT form, per
//               32-element block: ACT 8 int8 codes (q8_1 style: d = amax / 127,
//               four codes a u32), 16 f16 pairs, 32 f32 copies; xs[block] =
//               (d, sum of the block's values as the GEMV sees them: d * Σq).
//               Every weight row of the call (gate and up, or Q, K and V) dots
//               this one copy.
//   main        every invocation accumulates, in registers, the workgroup's
//               dq_nacc() weight rows' dots over its share of the weight "items"
//               (VW quant words of a 16-byte segment of a block) sharing each
//               activation load, then one reduction at the end. The int8 form
//               dots four codes at a time with dot4I8Packed; unsigned weight
//               codes (q4_0 / q4_1 / q4_k nibbles, q5_0 / q5_1 / q5_k 5-bit codes,
//               q2_k fields) go in as they are and their
//               offsets (-8 d, -16 d, m, -dmin m) come through the activation
//               block sums xs.y (q2_k's per-16 minima: the item's own code sums,
//               dot4I8Packed against ones); q3_k, q6_k and the iq4 levels become
//               signed bytes in registers. SPLIT > 1: workgroup (g, s) covers the s-th of SPLIT
//               ranges of a row's blocks (the family writes partials and its
//               `sum_splits` entry finishes).
//
// The family (the shader's own file) declares `struct Dims` (with at least `k`),
// `dims` at binding 4, its outputs, `const DQ_SETS` (accumulators per output row:
// DQ_SETS * ROWS <= 16 per workgroup), and supplies
//   fn dq_nrows() -> u32          outputs (row groups of ROWS cover them)
//   fn dq_row(row0, r) -> u32     the weight row of accumulator r (clamped in range)
//   fn dq_out(row0, s, r)         invocation r < ROWS stores output row0 + r of
//                                 split s from dq_total(r) (.. of the main include)
// Uses the head's overrides (qdp4a_head.wgsl) WG, ROWS (<= 8), QFMT (0 q8_0, 1 q4_0, 2 q4_1,
// 3 q5_0, 4 q5_1, 5 q2_k, 6 q3_k, 7 q4_k, 8 q5_k, 9 q6_k, 10 iq4_nl, 11 iq4_xs:
// kernels::wgsl::qfmt), VW (1, 2 or 4 words per item), ACT (8, 16, 32) and SPLIT.
// Weights in the GPU layout of kernels::quant::QMatrix: wq the quant bytes (bound
// padded to 16 bytes), ws the 16-bit header fields.
// Needs k a whole number of blocks.
// Requires: qdp4a_head.wgsl, qgeom.wgsl.

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> ws: array<u32>;
@group(0) @binding(5) var<storage, read_write> xq: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> xs: array<vec2<f32>>;

// ---------------------------------------------------------------- quantize

@compute @workgroup_size(64)
fn quantize(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let b = gid.x + gid.y * nwg.x * 64u;
    if (b >= dims.k / 32u) {
        return;
    }
    var v: array<vec4<f32>, 8>;
    var amax = 0.0;
    for (var i = 0u; i < 8u; i++) {
        v[i] = x[8u * b + i];
        let a = abs(v[i]);
        amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
    }
    if (ACT == 8u) {
        let d = amax / 127.0;
        let id = select(0.0, 1.0 / d, d > 0.0);
        var qsum = 0;
        var packed: array<u32, 8>;
        for (var i = 0u; i < 8u; i++) {
            let q = vec4<i32>(round(v[i] * id));
            qsum += q.x + q.y + q.z + q.w;
            packed[i] = pack4xI8(q);
        }
        xq[2u * b] = vec4<u32>(packed[0], packed[1], packed[2], packed[3]);
        xq[2u * b + 1u] = vec4<u32>(packed[4], packed[5], packed[6], packed[7]);
        xs[b] = vec2<f32>(d, d * f32(qsum));
    } else if (ACT == 16u) {
        var s = 0.0;
        for (var i = 0u; i < 8u; i += 2u) {
            let w = vec4<u32>(pack2x16float(v[i].xy), pack2x16float(v[i].zw),
                              pack2x16float(v[i + 1u].xy), pack2x16float(v[i + 1u].zw));
            xq[4u * b + i / 2u] = w;
            let r0 = vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
            let r1 = vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w));
            s += dot(r0, vec4<f32>(1.0)) + dot(r1, vec4<f32>(1.0));
        }
        xs[b] = vec2<f32>(1.0, s);
    } else {
        var s = 0.0;
        for (var i = 0u; i < 8u; i++) {
            xq[8u * b + i] = bitcast<vec4<u32>>(v[i]);
            s += dot(v[i], vec4<f32>(1.0));
        }
        xs[b] = vec2<f32>(1.0, s);
    }
}

// ------------------------------------------------------------ block layout

// A block's quant words (qgeom.wgsl's qwpb a block): q5_0 / q5_1 qh, then 16 code
// bytes; q2_k 16 scale bytes, 64 code bytes; q3_k hmask 32, codes 64, scales 12,
// pad 4; q4_k 8 sub-block scales and 8 minima a byte each, codes 128; q5_k the same
// 16, qh 32, codes 128; q6_k ql 128, qh 64, scales 16; iq4_xs scales_l 4, codes 128.

// Whether a block's code segments are 16-byte aligned in wq (its quant words a
// multiple of 4, qgeom.wgsl's qwpb): all but q5_0 / q5_1 (5 words) and iq4_xs (33),
// read word by word.
fn dq_aligned() -> bool {
    return QFMT != 3u && QFMT != 4u && QFMT != 11u;
}

// 16-byte code segments per block (an item is VW words of one).
fn dq_nseg() -> u32 {
    switch QFMT {
        case 0u: { return 2u; }
        case 5u, 6u, 9u: { return 4u; }
        case 7u, 8u, 11u: { return 8u; }
        default: { return 1u; }
    }
}

// Activation streams a segment dots against (one per group of codes sharing a
// weight scale and an activation block): q8_0 1; the 32-element nibble formats 2
// (low and high nibbles: elements 0..16, 16..32); q4_k / q5_k 2 (low nibbles:
// sub-block 2jj, high: 2jj + 1); iq4_xs 2 (the halves of sub-block j); q2_k / q3_k
// (2-bit fields 0..3 of a code byte) and q6_k 4.
fn dq_nstreams() -> u32 {
    switch QFMT {
        case 0u: { return 1u; }
        case 5u, 6u, 9u: { return 4u; }
        default: { return 2u; }
    }
}

// The first activation quad (4 elements) of stream s of segment j of block b.
fn dq_squad(b: u32, j: u32, s: u32) -> u32 {
    switch QFMT {
        case 0u: { return 8u * b + 4u * j; }
        case 7u, 8u: { return 64u * b + 16u * (j / 2u) + 4u * (j % 2u) + 8u * s; }
        case 5u, 6u, 9u: { return 64u * b + 32u * (j / 2u) + 8u * s + 4u * (j % 2u); }
        case 11u: { return 64u * b + 8u * j + 4u * s; }
        default: { return 8u * b + 4u * s; }
    }
}

// The 32-element activation block of stream s of segment j of block b.
fn dq_sblock(b: u32, j: u32, s: u32) -> u32 {
    switch QFMT {
        case 7u, 8u: { return 8u * b + 2u * (j / 2u) + s; }
        case 5u, 6u, 9u: { return 8u * b + 4u * (j / 2u) + s; }
        case 11u: { return 8u * b + j; }
        default: { return b; }
    }
}

// Quant word i (global word index).
fn dq_w1(i: u32) -> u32 {
    return wq[i >> 2u][i & 3u];
}

// VW quant words from word i (in .x, .xy or .xyzw): one 16-byte (or 8-byte) load
// where the format's segments are 16-byte aligned in the GPU layout (i a multiple
// of VW there), word by word otherwise.
fn dq_wload(i: u32) -> vec4<u32> {
    if (dq_aligned()) {
        if (VW == 4u) {
            return wq[i >> 2u];
        }
        if (VW == 2u) {
            let v = wq[i >> 2u];
            return select(vec4<u32>(v.xy, 0u, 0u), vec4<u32>(v.zw, 0u, 0u), (i & 2u) != 0u);
        }
    }
    var out = vec4<u32>(0u);
    for (var t = 0u; t < VW; t++) {
        out[t] = dq_w1(i + t);
    }
    return out;
}

// ------------------------------------------------------------- activation

// The activation of the current item: VW quads per stream (stream s at
// xa[4 * s + t]; ACT 8 a packed word in .x, ACT 16 two f16 pairs in .xy, ACT 32
// four f32 bits) and each stream's block (d, sum).
var<private> xa: array<vec4<u32>, 16>;
var<private> xd: array<vec2<f32>, 4>;

fn dq_aquad(q: u32) -> vec4<u32> {
    if (ACT == 8u) {
        return vec4<u32>(xq[q >> 2u][q & 3u], 0u, 0u, 0u);
    }
    if (ACT == 16u) {
        let v = xq[q >> 1u];
        return select(vec4<u32>(v.xy, 0u, 0u), vec4<u32>(v.zw, 0u, 0u), (q & 1u) == 1u);
    }
    return xq[q];
}

fn dq_load_act(b: u32, j: u32, p: u32) {
    for (var s = 0u; s < dq_nstreams(); s++) {
        let q0 = dq_squad(b, j, s) + p * VW;
        xd[s] = xs[dq_sblock(b, j, s)];
        if (ACT == 8u && VW == 4u) {
            let v = xq[q0 >> 2u];
            xa[4u * s] = vec4<u32>(v.x, 0u, 0u, 0u);
            xa[4u * s + 1u] = vec4<u32>(v.y, 0u, 0u, 0u);
            xa[4u * s + 2u] = vec4<u32>(v.z, 0u, 0u, 0u);
            xa[4u * s + 3u] = vec4<u32>(v.w, 0u, 0u, 0u);
        } else {
            for (var t = 0u; t < VW; t++) {
                xa[4u * s + t] = dq_aquad(q0 + t);
            }
        }
    }
}

// Σ over the item's VW words of w (four signed 8-bit codes a word) · stream s,
// in activation units (times xd[s].x gives the dot).
fn dq_sdot(w: vec4<u32>, s: u32) -> f32 {
    if (ACT == 8u) {
        var acc = 0;
        for (var t = 0u; t < VW; t++) {
            acc += dot4I8Packed(w[t], xa[4u * s + t].x);
        }
        return f32(acc);
    }
    var acc = 0.0;
    for (var t = 0u; t < VW; t++) {
        let wv = vec4<f32>(unpack4xI8(w[t]));
        let a = xa[4u * s + t];
        if (ACT == 16u) {
            acc += dot(wv, vec4<f32>(unpack2x16float(a.x), unpack2x16float(a.y)));
        } else {
            acc += dot(wv, bitcast<vec4<f32>>(a));
        }
    }
    return acc;
}

// ------------------------------------------------------------ weight dots

// Byte i of three packed scale words (q3_k's 12 scale bytes).
fn dq_kbyte(sc: vec3<u32>, i: u32) -> u32 {
    return (sc[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

// Four 6-bit codes a word (0..63) as signed bytes v - 32.
fn dq_s6(v: vec4<u32>) -> vec4<u32> {
    let b = v ^ vec4<u32>(0x20202020u);
    let s = b & vec4<u32>(0x20202020u);
    return b | (s << vec4<u32>(1u)) | (s << vec4<u32>(2u));
}

// Four 4-bit fields of h (bits 0..3, 4..7, ..), one a byte: bit i of h to bit 8 i.
fn dq_spread4(h: u32) -> u32 {
    return (h & 1u) | ((h & 2u) << 7u) | ((h & 4u) << 14u) | ((h & 8u) << 21u);
}

// The IQ4 levels of a word's four nibble codes (one a byte, 0..15) as signed bytes.
fn dq_iq4(n: vec4<u32>) -> vec4<u32> {
    // -127 -104 -83 -65 | -49 -35 -22 -10 | 1 13 25 38 | 53 69 89 113, bytes little end first
    let lut = vec4<u32>(0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u);
    var out = vec4<u32>(0u);
    for (var t = 0u; t < VW; t++) {
        var w = 0u;
        for (var i = 0u; i < 4u; i++) {
            let c = (n[t] >> (8u * i)) & 15u;
            w |= ((lut[c >> 2u] >> (8u * (c & 3u))) & 0xffu) << (8u * i);
        }
        out[t] = w;
    }
    return out;
}

// Q3_K: the signed 6-bit scale of group g (0..16) from the block's three scale words.
fn dq_k3(sc: vec3<u32>, g: u32) -> f32 {
    let lo = select(dq_kbyte(sc, g - 8u) >> 4u, dq_kbyte(sc, g) & 15u, g < 8u);
    let hi = (dq_kbyte(sc, 8u + g % 4u) >> (2u * (g / 4u))) & 3u;
    return f32(i32(lo | (hi << 4u)) - 32);
}

// Byte i (0..3) of word w.
fn dq_ubyte(w: u32, i: u32) -> u32 {
    return (w >> (8u * i)) & 0xffu;
}

// Signed byte i of word w, as f32.
fn dq_sbyte(w: u32, i: u32) -> f32 {
    return f32((bitcast<i32>(w) << (24u - 8u * i)) >> 24u);
}

// The contribution of item (segment j, part p) of global block gb to its row,
// against the activation loaded by dq_load_act.
fn dq_item(gb: u32, j: u32, p: u32) -> f32 {
    let base = gb * qwpb();
    let lo4 = vec4<u32>(0x0f0f0f0fu);
    switch QFMT {
        case 0u: {
            let w = dq_wload(base + 4u * j + p * VW);
            return qhalf(gb, 0u) * xd[0].x * dq_sdot(w, 0u);
        }
        case 1u, 2u, 10u: {
            let w = dq_wload(base + p * VW);
            let d = qhalf(gb, 0u);
            if (QFMT == 10u) {
                return d * (xd[0].x * dq_sdot(dq_iq4(w & lo4), 0u) + xd[1].x * dq_sdot(dq_iq4((w >> vec4<u32>(4u)) & lo4), 1u));
            }
            var r = d * (xd[0].x * dq_sdot(w & lo4, 0u) + xd[1].x * dq_sdot((w >> vec4<u32>(4u)) & lo4, 1u));
            if (p == 0u) {
                let off = select(-8.0 * d, qhalf(gb, 1u), QFMT == 2u);
                // Both streams are halves of the same activation block.
                r += off * xd[0].y;
            }
            return r;
        }
        case 3u, 4u: {
            // qh (bit e: element e's fifth bit), then the nibbles as q4_0's
            let qh = dq_w1(base);
            let w = dq_wload(base + 1u + p * VW);
            var hl = vec4<u32>(0u);
            var hh = vec4<u32>(0u);
            for (var t = 0u; t < VW; t++) {
                let e = 4u * (p * VW + t);
                hl[t] = dq_spread4(qh >> e) << 4u;
                hh[t] = dq_spread4(qh >> (16u + e)) << 4u;
            }
            let d = qhalf(gb, 0u);
            var r = d * (xd[0].x * dq_sdot((w & lo4) | hl, 0u) + xd[1].x * dq_sdot(((w >> vec4<u32>(4u)) & lo4) | hh, 1u));
            if (p == 0u) {
                let off = select(-16.0 * d, qhalf(gb, 1u), QFMT == 4u);
                r += off * xd[0].y;
            }
            return r;
        }
        case 5u, 6u: {
            // segment j = 2 n + l16: code bytes 32 n + 16 l16 .., 2-bit field s of a
            // byte is element 128 n + 32 s + 16 l16 + i, scale group 8 n + 2 s + l16
            let n = j / 2u;
            let l16 = j % 2u;
            let ones = vec4<u32>(0x01010101u);
            let h3 = vec4<u32>(0x03030303u);
            let d = qhalf(gb, 0u);
            var r = 0.0;
            if (QFMT == 5u) {
                let w = dq_wload(base + 4u + 8u * n + 4u * l16 + p * VW);
                let s0 = dq_w1(base + 2u * n);
                let s1 = dq_w1(base + 2u * n + 1u);
                let dmin = qhalf(gb, 1u);
                for (var s = 0u; s < 4u; s++) {
                    let sb = dq_ubyte(select(s1, s0, s < 2u), 2u * (s % 2u) + l16);
                    let c = (w >> vec4<u32>(2u * s)) & h3;
                    r += xd[s].x * (d * f32(sb & 15u) * dq_sdot(c, s) - dmin * f32(sb >> 4u) * dq_sdot(ones, s));
                }
                return r;
            }
            let w = dq_wload(base + 8u + 8u * n + 4u * l16 + p * VW);
            let hm = dq_wload(base + 4u * l16 + p * VW);
            let sc = vec3<u32>(dq_w1(base + 24u), dq_w1(base + 25u), dq_w1(base + 26u));
            for (var s = 0u; s < 4u; s++) {
                // 3-bit code u = field | hmask bit << 2, value u - 4 as a signed byte
                let u = ((w >> vec4<u32>(2u * s)) & h3) | (((hm >> vec4<u32>(4u * n + s)) & ones) << vec4<u32>(2u));
                let v = (u & h3) | ((((~u) >> vec4<u32>(2u)) & ones) * 0xfcu);
                r += xd[s].x * dq_k3(sc, 8u * n + 2u * s + l16) * dq_sdot(v, s);
            }
            return d * r;
        }
        case 11u: {
            // iq4_xs: sub-block j, its 6-bit scale from scales_l (word 0) and scales_h
            let w = dq_wload(base + 1u + 4u * j + p * VW);
            let ls = ((dq_w1(base) >> (4u * j)) & 15u) | (((qbits16(gb, 1u) >> (2u * j)) & 3u) << 4u);
            let dl = qhalf(gb, 0u) * f32(i32(ls) - 32);
            return dl * (xd[0].x * dq_sdot(dq_iq4(w & lo4), 0u) + xd[1].x * dq_sdot(dq_iq4((w >> vec4<u32>(4u)) & lo4), 1u));
        }
        case 7u, 8u: {
            let jj = j / 2u;
            var wl = vec4<u32>(0u);
            var wh = vec4<u32>(0u);
            if (QFMT == 7u) {
                let w = dq_wload(base + 4u + 8u * jj + 4u * (j % 2u) + p * VW);
                wl = w & lo4;
                wh = (w >> vec4<u32>(4u)) & lo4;
            } else {
                // q5_k: qh byte l holds the fifth bits of elements l (bit 2 jj) and
                // 32 + l (bit 2 jj + 1) of 64-element group jj
                let w = dq_wload(base + 12u + 8u * jj + 4u * (j % 2u) + p * VW);
                let qh = dq_wload(base + 4u + 4u * (j % 2u) + p * VW);
                let one = vec4<u32>(0x01010101u);
                wl = (w & lo4) | (((qh >> vec4<u32>(2u * jj)) & one) << vec4<u32>(4u));
                wh = ((w >> vec4<u32>(4u)) & lo4) | (((qh >> vec4<u32>(2u * jj + 1u)) & one) << vec4<u32>(4u));
            }
            // the block's 16 header bytes: scales 0..8, minima 8..16 (one load)
            let hv = wq[base >> 2u];
            let sw = hv[jj / 2u] >> (16u * (jj % 2u));
            let mw = hv[2u + jj / 2u] >> (16u * (jj % 2u));
            let a = vec2<f32>(f32(sw & 255u), f32(mw & 255u));
            let c = vec2<f32>(f32((sw >> 8u) & 255u), f32((mw >> 8u) & 255u));
            var r = qhalf(gb, 0u) * (a.x * xd[0].x * dq_sdot(wl, 0u)
                                     + c.x * xd[1].x * dq_sdot(wh, 1u));
            if (j % 2u == 0u && p == 0u) {
                r -= qhalf(gb, 1u) * (a.y * xd[0].y + c.y * xd[1].y);
            }
            return r;
        }
        default: {
            // q6_k: segment j = 2 n + l16 covers l = 16 l16 .. + 16 of half n.
            let n = j / 2u;
            let l16 = j % 2u;
            let o = 16u * n + 4u * l16 + p * VW;
            let qla = dq_wload(base + o);
            let qlb = dq_wload(base + o + 8u);
            let qh = dq_wload(base + 32u + 8u * n + 4u * l16 + p * VW);
            let h3 = vec4<u32>(0x03030303u);
            let s0 = dq_w1(base + 48u + 2u * n);
            let s1 = dq_w1(base + 49u + 2u * n);
            // scales 8 n + l16 + 2 q: bytes l16, l16 + 2 of s0 and of s1.
            let r = dq_sbyte(s0, l16) * xd[0].x * dq_sdot(dq_s6((qla & lo4) | ((qh & h3) << vec4<u32>(4u))), 0u)
                  + dq_sbyte(s0, l16 + 2u) * xd[1].x * dq_sdot(dq_s6((qlb & lo4) | (((qh >> vec4<u32>(2u)) & h3) << vec4<u32>(4u))), 1u)
                  + dq_sbyte(s1, l16) * xd[2].x * dq_sdot(dq_s6(((qla >> vec4<u32>(4u)) & lo4) | (((qh >> vec4<u32>(4u)) & h3) << vec4<u32>(4u))), 2u)
                  + dq_sbyte(s1, l16 + 2u) * xd[3].x * dq_sdot(dq_s6(((qlb >> vec4<u32>(4u)) & lo4) | (((qh >> vec4<u32>(6u)) & h3) << vec4<u32>(4u))), 3u);
            return qhalf(gb, 0u) * r;
        }
    }
}

// ------------------------------------------------------------ accumulation

// Register accumulators of the workgroup's dq_nacc() weight rows (<= 16).
var<private> acc: array<f32, 16>;

// Accumulators per workgroup: DQ_SETS for each of its ROWS output rows.
fn dq_nacc() -> u32 {
    return DQ_SETS * ROWS;
}

// Where a workgroup works: its first output row and its split, from its linear index.
fn dq_group(wid: vec3<u32>, nwg: vec3<u32>) -> vec2<u32> {
    let g = wid.x + wid.y * nwg.x;
    return vec2<u32>((g / SPLIT) * ROWS, g % SPLIT);
}

// The entry points' start: the workgroup's (first row, split), and, for a workgroup
// with rows to compute (at.x < dq_nrows(); the others return), invocation tid's
// accumulators in acc.
fn dq_start(wid: vec3<u32>, nwg: vec3<u32>, tid: u32) -> vec2<u32> {
    let at = dq_group(wid, nwg);
    if (at.x < dq_nrows()) {
        dq_accumulate(at.x, at.y, tid);
    }
    return at;
}

// Invocation tid's share of the items of the workgroup's weight rows in split s:
// items strided by WG, each item's activation loaded once for all rows.
fn dq_accumulate(row0: u32, s: u32, tid: u32) {
    let nacc = dq_nacc();
    for (var r = 0u; r < nacc; r++) {
        acc[r] = 0.0;
    }
    let nb = dims.k / qbe();
    let parts = 4u / VW;
    let per_block = dq_nseg() * parts;
    let b0 = nb * s / SPLIT;
    let b1 = nb * (s + 1u) / SPLIT;
    for (var i = b0 * per_block + tid; i < b1 * per_block; i += WG) {
        let b = i / per_block;
        let rem = i % per_block;
        let j = rem / parts;
        let p = rem % parts;
        dq_load_act(b, j, p);
        for (var r = 0u; r < nacc; r++) {
            acc[r] += dq_item(dq_row(row0, r) * nb + b, j, p);
        }
    }
}
