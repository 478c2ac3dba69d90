// The partial sums of block_wg.wgsl's entry point for GEMV-style kernels over
// block-format weights (qgemv_wg, qqkv_proj_wg): invocation tid takes the quant
// words strided by WG of the ROWS rows from row0 (rows past the shader's row_count()
// recompute the last one, never stored), for all rows from the same x loads, into
// register accumulators, and leaves them in partial[r * WG + tid].
// Requires: qblock.wgsl, block_wg.wgsl, reduce_wg.wgsl.

fn block_partials(row0: u32, tid: u32) -> u32 {
    let wpr = dims.k / qbe() * qunits();
    let last = row_count() - 1u;
    var acc: array<f32, 8>;
    for (var wi = tid; wi < wpr; wi += WG) {
        for (var r = 0u; r < ROWS; r++) {
            acc[r] += qdot(min(row0 + r, last) * wpr, wi, 0u);
        }
    }
    for (var r = 0u; r < ROWS; r++) {
        partial[r * WG + tid] = acc[r];
    }
    return ROWS;
}
