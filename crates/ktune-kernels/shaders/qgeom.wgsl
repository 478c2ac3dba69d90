// Block geometry shared by the quantized shaders' decoders (qblock.wgsl and
// qdp4a.wgsl; `shader!` appends this file after either): elements, quant words and
// 16-bit header fields per block, and the header fields read from `ws` (the
// including shader's array<u32>, two fields a word). QFMT is the including shader's
// override (kernels::wgsl::qfmt: 0 q8_0, 1 q4_0, 2 q4_1, 3 q5_0, 4 q5_1, 5 q2_k,
// 6 q3_k, 7 q4_k, 8 q5_k, 9 q6_k, 10 iq4_nl, 11 iq4_xs).

// Elements per block.
fn qbe() -> u32 {
    return select(32u, 256u, (QFMT >= 5u && QFMT <= 9u) || QFMT == 11u);
}

// Quant words per block (QFormat::gpu_quant_bytes / 4).
fn qwpb() -> u32 {
    switch QFMT {
        case 0u: { return 8u; }
        case 3u, 4u: { return 5u; }
        case 5u: { return 20u; }
        case 6u: { return 28u; }
        case 7u: { return 36u; }
        case 8u: { return 44u; }
        case 9u: { return 52u; }
        case 11u: { return 33u; }
        default: { return 4u; }
    }
}

// 16-bit header fields per block (d; d, m; d, dmin; iq4_xs d, scales_h).
fn qspb() -> u32 {
    return select(1u, 2u, QFMT == 2u || QFMT == 4u || QFMT == 5u || QFMT == 7u || QFMT == 8u || QFMT == 11u);
}

// Header field i of global block b: as f16, and its raw bits.
fn qhalf(b: u32, i: u32) -> f32 {
    let idx = b * qspb() + i;
    let p = unpack2x16float(ws[idx >> 1u]);
    return select(p.x, p.y, (idx & 1u) == 1u);
}

fn qbits16(b: u32, i: u32) -> u32 {
    let idx = b * qspb() + i;
    return (ws[idx >> 1u] >> ((idx & 1u) * 16u)) & 0xffffu;
}
