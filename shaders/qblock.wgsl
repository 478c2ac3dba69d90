// Block decoding shared by the quantized shaders (qgemv_*, qgemm_tiled, qgate_up_wg,
// qqkv_proj_wg, norm_gemv_q_*): `shader!(FILE, "qblock.wgsl", ..)` appends this file
// to each. It reads the including shader's `override QFMT: u32`, `wq` and `ws`
// bindings (array<u32>), and for `qdot` its `x: array<vec4<f32>>`.
// QFMT 0 = q8_0, 1 = q4_0, 2 = q4_1.
// wq: the quantized bytes as u32 words (8 words per q8_0 block, 4 per 4-bit block),
// ws: the f16 scales as u32 words (d per block; d, m per block for q4_1).

// Quant words per block.
fn qwords() -> u32 {
    return select(4u, 8u, QFMT == 0u);
}

// Scale d and offset m (0 unless q4_1) of global block b.
fn qscale(b: u32) -> vec2<f32> {
    if (QFMT == 2u) {
        return unpack2x16float(ws[b]);
    }
    let pair = unpack2x16float(ws[b >> 1u]);
    return vec2<f32>(select(pair.x, pair.y, (b & 1u) == 1u), 0.0);
}

// Word gw of the quants dequantized: q8_0 gives 4 elements in .lo; the 4-bit
// formats give elements j*4..j*4+3 of the block in .lo and 16 + j*4.. in .hi
// (ggml nibble order), j = word index within its block.
struct QWord { lo: vec4<f32>, hi: vec4<f32> }

fn qdecode(gw: u32) -> QWord {
    let word = wq[gw];
    let sc = qscale(gw / qwords());
    if (QFMT == 0u) {
        let v = (vec4<i32>(bitcast<i32>(word)) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u);
        return QWord(vec4<f32>(v) * sc.x, vec4<f32>(0.0));
    }
    let lo = vec4<f32>((vec4<u32>(word) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u));
    let hi = vec4<f32>((vec4<u32>(word) >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u));
    if (QFMT == 1u) {
        return QWord((lo - 8.0) * sc.x, (hi - 8.0) * sc.x);
    }
    return QWord(lo * sc.x + sc.y, hi * sc.x + sc.y);
}

// Word wi of a row whose quants start at word `rw`, dotted with the activation row
// starting at vec4 index `xv`.
fn qdot(rw: u32, wi: u32, xv: u32) -> f32 {
    let qw = qwords();
    let bi = wi / qw;
    let j = wi % qw;
    let d = qdecode(rw + wi);
    if (QFMT == 0u) {
        return dot(d.lo, x[xv + bi * 8u + j]);
    }
    return dot(d.lo, x[xv + bi * 8u + j]) + dot(d.hi, x[xv + bi * 8u + 4u + j]);
}
