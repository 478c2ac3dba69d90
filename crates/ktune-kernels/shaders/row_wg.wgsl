// Entry point `main` of the row kernels that give each row a workgroup
// (`shader!(FILE, .., "row_wg.wgsl", "reduce_wg.wgsl", ..)`): workgroup i of the
// dispatch (the host spreads large counts over x and y) runs the shader's
// `fn run_row(row: u32, first: u32, stride: u32)` for row i < its
// `fn row_count() -> u32`, invocation `tid` as first with stride WG (the shader's
// `override WG: u32`). The row body reduces with row_sum / row_max (reduce_wg.wgsl;
// reduce_sg.wgsl for the same body run by row_sg.wgsl).

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row < row_count()) {
        run_row(row, tid, WG);
    }
}
