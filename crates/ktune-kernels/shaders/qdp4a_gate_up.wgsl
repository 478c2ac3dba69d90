// The fused gate+up family of the second-generation quantized projections
// (qdp4a.wgsl): y[j] = act(x·w[j]) * (x·w[n + j]) for one token, w[2n, k]
// (`shader!(head "qdp4a_head.wgsl"; "qdp4a_gate_up.wgsl", MAIN, "qdp4a.wgsl",
// "act.wgsl", ..)`).
// A workgroup owns ROWS features: 2 ROWS accumulators, the gate rows then the up
// rows, all dotting the one quantized activation; the activation product is
// applied in registers by the invocation that stores the feature. With SPLIT > 1
// `main` writes the gate and up partials of split s (part[s * 2n + j] and
// part[s * 2n + n + j]) and `sum_splits` adds them in a fixed order, then applies
// the activation product. dims.act: 0 silu, 1 gelu_tanh (act.wgsl).
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

fn dq_out(row0: u32, s: u32, r: u32) {
    let j = row0 + r;
    if (j >= dims.n) {
        return;
    }
    let g = dq_total(r);
    let u = dq_total(ROWS + r);
    if (SPLIT == 1u) {
        y[j] = act(g, dims.act == 1u) * u;
    } else {
        part[s * 2u * dims.n + j] = g;
        part[s * 2u * dims.n + dims.n + j] = u;
    }
}

@compute @workgroup_size(64)
fn sum_splits(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = gid.x + gid.y * nwg.x * 64u;
    if (j >= dims.n) {
        return;
    }
    var g = 0.0;
    var u = 0.0;
    for (var i = 0u; i < SPLIT; i++) {
        g += part[i * 2u * dims.n + j];
        u += part[i * 2u * dims.n + dims.n + j];
    }
    y[j] = act(g, dims.act == 1u) * u;
}
