// Quantized fused gate+up with subgroup reductions: y[t, j] = act(x[t]·w[j]) *
// (x[t]·w[n + j]) with w[2n, k] in ggml blocks (QFMT: any ggml block format)
// dequantized in registers. Each workgroup owns ROWS features of one token row
// (grid z = t), spread over its subgroups; a subgroup's lanes stride over the
// quant units of the feature's gate and up rows together (each activation load
// feeds both), one subgroupAdd each, and lane 0 applies the activation product.
// No workgroup memory, no barriers: qgemv_subgroup's loop over two rows (on an
// H200 the workgroup-reduced gate_up_q_wg took 1.5-8x the time of two
// gemv_q_subgroup calls). Needs SUBGROUP and k a whole number of blocks (qbe()).
// Includes: qgate_up.wgsl (interface: bindings, Dims), qblock.wgsl, act.wgsl.
// Requires: grid_sg.wgsl, grid.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override UNROLL: u32 = 1u; // units of each row a lane decodes per round, loads all issued first
override QFMT: u32 = 0u;

@compute @workgroup_size(WG)
fn main(s: SgGrid) {
    let j0 = wg_linear(s.wid, s.nwg) * ROWS;
    let t = s.wid.z;
    let n = dims.n;
    let wpr = dims.k / qbe() * qunits();
    let xv = t * (dims.k / 4u);
    for (var r = s.sg; r < ROWS; r += s.nsg) {
        let j = j0 + r;
        if (j >= n) {
            break;
        }
        var g = 0.0;
        var u = 0.0;
        // UNROLL units of each row a lane per round (a constant-trip loop with no
        // guard: its loads all in flight before the first is used), the rest one at
        // a time
        let round = s.sg_size * UNROLL;
        let full = wpr / round * round;
        for (var w0 = s.lane; w0 < full; w0 += round) {
            for (var v = 0u; v < UNROLL; v++) {
                g += qdot(j * wpr, w0 + v * s.sg_size, xv);
                u += qdot((n + j) * wpr, w0 + v * s.sg_size, xv);
            }
        }
        for (var wi = full + s.lane; wi < wpr; wi += s.sg_size) {
            g += qdot(j * wpr, wi, xv);
            u += qdot((n + j) * wpr, wi, xv);
        }
        let gs = subgroupAdd(g);
        let us = subgroupAdd(u);
        if (s.lane == 0u) {
            y[t * n + j] = act(gs, dims.act == 1u) * us;
        }
    }
}
