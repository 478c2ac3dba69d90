// Entry point `main` of the GEMV-style kernels whose workgroup computes a block of
// ROWS consecutive outputs and reduces per-row partial sums through workgroup
// memory (`shader!(FILE, .., "block_wg.wgsl", "reduce_wg.wgsl", ..)`): workgroup i
// of the dispatch (spread over x and y) owns rows row0 = i * ROWS ..; every
// invocation runs the shader's `fn block_partials(row0: u32, tid: u32) -> u32`,
// which leaves its partial sums in partial[r * WG + tid] and returns how many rows
// r of them the tree reduces (ROWS, or more with extra statistics), then invocation
// r < ROWS runs `fn block_store(row: u32, r: u32)` for row = row0 + r below the
// shader's `fn row_count() -> u32`, the row's sum in partial[r * WG]. Uses the
// shader's `override WG: u32`, `override ROWS: u32` and `partial` (reduce_wg.wgsl).

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    wg_sum_rows(tid, block_partials(row0, tid));
    if (tid < ROWS && row0 + tid < row_count()) {
        block_store(row0 + tid, tid);
    }
}
