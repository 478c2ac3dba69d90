// Fused RMSNorm prologue + quantized GEMV (decode) reduced with subgroup
// operations: y[n] = w[n,k] · (x * inv_rms * g'), w in ggml blocks (QFMT: any ggml
// block format) dequantized in registers, g' = g or 1 + g (unit_offset, Gemma),
// inv_rms = 1 / sqrt(mean(x²) + eps). The workgroup first forms x·g' once into
// workgroup memory (K4 = k / 4 vec4s), summing x² alongside (wg_total), then each
// subgroup owns whole rows (sg, sg + num_subgroups, ... of the workgroup's ROWS):
// its lanes stride over the row's quant words, dot them with x·g', and one
// subgroupAdd finishes the row, scaled by inv_rms. Needs SUBGROUP and k a whole
// number of blocks (qbe()).
//
// The decode chain's forms, as norm_gemv_subgroup.wgsl: the input x + r (residual
// 1) or x + rmsnorm(r) * g_r' (2), formed in the same prologue and written once to
// h by the first workgroup; with an activation the weight is the fused gate/up
// [2n, k] and y[r] = act(gate) * up. Without them the host binds x, g and y in
// place of r, g_r and h (never read or written).
// Includes: norm_gemv_q.wgsl (interface), norm_gemv_q_sg.wgsl (the prologue's
// bindings and gains, the entry point), qblock.wgsl (block decoding), act.wgsl,
// norm_gemv_sg.wgsl (prologue, rows). Its twin over a weight of per-operand
// formats: norm_gemv_qmix_subgroup.wgsl.
// Requires: grid_sg.wgsl, grid.wgsl, norm_gemv_sg.wgsl, norm_gemv_q_sg.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override QFMT: u32 = 0u;
override K4: u32 = 1u;

// This lane's partial dots of row `row` with xa: (gate or the row, up), striding
// over the row's quant units.
fn lane_dots(s: SgGrid, row: u32) -> vec2<f32> {
    let qu = qunits();
    let wpr = dims.k / qbe() * qu;
    var acc = vec2<f32>(0.0);
    for (var wi = s.lane; wi < wpr; wi += s.sg_size) {
        // Unit j of block bi covers x at qpos(j) within the block (two halves but for q8_0).
        let base = (wi / qu) * (qbe() / 4u);
        let p = qpos(wi % qu);
        let a0 = xa[base + p.x / 4u];
        let a1 = xa[base + p.y / 4u];
        let d = qdecode(row * wpr + wi);
        acc.x += dot(d.lo, a0);
        if (QFMT != 0u) {
            acc.x += dot(d.hi, a1);
        }
        if (dims.act != 0u) {
            let du = qdecode((row + dims.n) * wpr + wi);
            acc.y += dot(du.lo, a0);
            if (QFMT != 0u) {
                acc.y += dot(du.hi, a1);
            }
        }
    }
    return acc;
}
