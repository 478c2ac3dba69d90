// The workgroup-tree end of the fused RMSNorm + GEMV kernels (norm_gemv_wg,
// norm_gemv_q_wg) over block_wg.wgsl: an invocation's ROWS accumulators (dots with
// the unnormalised x·g) and its sum of squares of x go to `partial` for the tree
// (ROWS + 1 rows of it), and output r is its row's dot times 1 / rms(x).
// Requires: block_wg.wgsl, reduce_wg.wgsl.

// Leaves the invocation's accumulators and sum of squares in `partial`; the rows
// block_partials hands the tree.
fn norm_partials(acc: array<f32, 8>, ss: f32, tid: u32) -> u32 {
    for (var r = 0u; r < ROWS; r++) {
        partial[r * WG + tid] = acc[r];
    }
    partial[ROWS * WG + tid] = ss;
    return ROWS + 1u;
}

fn block_store(row: u32, r: u32) {
    let inv = inverseSqrt(partial[ROWS * WG] / f32(dims.k) + dims.eps);
    y[row] = partial[r * WG] * inv;
}
