// The fused gate+up family of the second-generation quantized projections
// (qdp4a.wgsl): y[j] = act(x·w[j]) * (x·w[n + j]) for one token, w[2n, k]
// (`shader!(head "qdp4a_head.wgsl"; "qdp4a_gate_up.wgsl", MAIN, "qdp4a.wgsl",
// "act.wgsl", ..)`).
// A workgroup owns ROWS features: 2 ROWS accumulators, the gate rows then the up
// rows, all dotting the one quantized activation; the activation product is
// applied by the invocation that stores the feature (with SPLIT > 1, by
// qdp4a_rows.wgsl's sum_splits after the gate and up partials are added).
// dims.act: 0 silu, 1 gelu_tanh (act.wgsl).
// Requires: qdp4a_head.wgsl, qdp4a.wgsl, qgeom.wgsl, qdp4a_rows.wgsl, act.wgsl.

// Accumulators per row of a row group (qdp4a.wgsl's dq_nacc): a gate and an up.
const DQ_SETS: u32 = 2u;

fn dq_row(row0: u32, r: u32) -> u32 {
    let last = dims.n - 1u;
    if (r < ROWS) {
        return min(row0 + r, last);
    }
    return dims.n + min(row0 + r - ROWS, last);
}

// Feature j's output from its gate and up totals.
fn dq_value(v: vec2<f32>) -> f32 {
    return act(v.x, dims.act == 1u) * v.y;
}
