// The uniform block, outputs and split partials of the second-generation quantized
// projections over n output rows (qdp4a_gemv.wgsl, qdp4a_gate_up.wgsl): dims.n
// rows of y from weights of k columns; dims.act (gate_up: 0 silu, 1 gelu_tanh; the
// GEMV's host passes none, a zero word); with SPLIT > 1 the partials in `part`,
// set c of row j of split s at part[(s * DQ_SETS + c) * n + j], added by
// `sum_splits` in a fixed order. The family supplies
// `fn dq_value(v: vec2<f32>) -> f32`, row j's output from its DQ_SETS
// (<= 2) totals.

struct Dims { n: u32, k: u32, act: u32 }

@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;
@group(0) @binding(7) var<storage, read_write> part: array<f32>;

fn dq_nrows() -> u32 {
    return dims.n;
}

fn dq_out(row0: u32, s: u32, r: u32) {
    let j = row0 + r;
    if (j >= dims.n) {
        return;
    }
    var v = vec2<f32>(0.0);
    for (var c = 0u; c < DQ_SETS; c++) {
        v[c] = dq_total(c * ROWS + r);
        if (SPLIT > 1u) {
            part[(s * DQ_SETS + c) * dims.n + j] = v[c];
        }
    }
    if (SPLIT == 1u) {
        y[j] = dq_value(v);
    }
}

@compute @workgroup_size(64)
fn sum_splits(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = gid.x + gid.y * nwg.x * 64u;
    if (j >= dims.n) {
        return;
    }
    var v = vec2<f32>(0.0);
    for (var i = 0u; i < SPLIT; i++) {
        for (var c = 0u; c < DQ_SETS; c++) {
            v[c] += part[(i * DQ_SETS + c) * dims.n + j];
        }
    }
    y[j] = dq_value(v);
}
