// The GEMV family of the second-generation quantized projections (qdp4a.wgsl):
// y[n] = w[n,k] · x[k], one accumulator per output row (`shader!(head
// "qdp4a_head.wgsl"; "qdp4a_gemv.wgsl", MAIN, "qdp4a.wgsl", ..)`). With SPLIT > 1
// `main` writes part[s * n + row] and `sum_splits` adds the splits in a fixed order.
// Requires: qdp4a_head.wgsl, qdp4a.wgsl, qgeom.wgsl, qdp4a_rows.wgsl.

// Accumulators per row of a row group (qdp4a.wgsl's dq_nacc).
const DQ_SETS: u32 = 1u;

fn dq_row(row0: u32, r: u32) -> u32 {
    return min(row0 + r, dims.n - 1u);
}

fn dq_out(row0: u32, s: u32, r: u32) {
    let row = row0 + r;
    if (row >= dims.n) {
        return;
    }
    if (SPLIT == 1u) {
        y[row] = dq_total(r);
    } else {
        part[s * dims.n + row] = dq_total(r);
    }
}

@compute @workgroup_size(64)
fn sum_splits(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * 64u;
    if (row >= dims.n) {
        return;
    }
    var s = 0.0;
    for (var i = 0u; i < SPLIT; i++) {
        s += part[i * dims.n + row];
    }
    y[row] = s;
}
