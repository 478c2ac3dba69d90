// Fused RMSNorm prologue + quantized GEMV (decode) reduced with subgroup
// operations: y[n] = w[n,k] · (x * inv_rms * g'), w in ggml blocks (QFMT selects
// q8_0 / q4_0 / q4_1) dequantized in registers, g' = g or 1 + g (unit_offset,
// Gemma), inv_rms = 1 / sqrt(mean(x²) + eps). Every subgroup first sums x² over k
// itself (k floats from cache, one subgroupAdd), then owns whole rows (sg,
// sg + num_subgroups, ... of the workgroup's ROWS): its lanes stride over the row's
// quant words, dot them with x·g', and one subgroupAdd finishes the row, scaled by
// inv_rms; no workgroup memory, no barriers. Needs SUBGROUP and k a whole number of blocks (qbe()).
// Includes: norm_gemv_q.wgsl (interface), qblock.wgsl (block decoding).
// Requires: grid_sg.wgsl, grid.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override QFMT: u32 = 0u;

@compute @workgroup_size(WG)
fn main(s: SgGrid) {
    let row0 = wg_linear(s.wid, s.nwg) * ROWS;
    let qu = qunits();
    let wpr = dims.k / qbe() * qu;
    var ss = 0.0;
    for (var c = s.lane; c < dims.k / 4u; c += s.sg_size) {
        let v = x[c];
        ss += dot(v, v);
    }
    let inv = inverseSqrt(subgroupAdd(ss) / f32(dims.k) + dims.eps);
    let off = vec4<f32>(select(0.0, 1.0, dims.unit_offset != 0u));
    for (var r = s.sg; r < ROWS; r += s.nsg) {
        let row = row0 + r;
        if (row >= dims.n) { break; }
        var acc = 0.0;
        for (var wi = s.lane; wi < wpr; wi += s.sg_size) {
            // Unit j of block bi covers x at qpos(j) within the block (two halves but for q8_0).
            let base = (wi / qu) * (qbe() / 4u);
            let p = qpos(wi % qu);
            let i0 = base + p.x / 4u;
            let i1 = base + p.y / 4u;
            let d = qdecode(row * wpr + wi);
            acc += dot(d.lo, x[i0] * (g[i0] + off));
            if (QFMT != 0u) {
                acc += dot(d.hi, x[i1] * (g[i1] + off));
            }
        }
        let total = subgroupAdd(acc);
        if (s.lane == 0u) {
            y[row] = total * inv;
        }
    }
}
