// Entry point `main` of the row kernels that give each row a subgroup
// (`shader!(FILE, .., "row_sg.wgsl", "reduce_sg.wgsl", ..)`): workgroup i of the
// dispatch (spread over x and y) owns rows i * ROWS .. (i + 1) * ROWS, spread over
// its subgroups (subgroup s takes rows s, s + num_subgroups, ...), and runs the
// shader's `fn run_row(row: u32, first: u32, stride: u32)` for each row below its
// `fn row_count() -> u32`, lane as first with stride the subgroup size. No workgroup
// memory, no barriers. Uses the shader's `override WG: u32` and `override ROWS: u32`;
// needs SUBGROUP and a workgroup at least one subgroup wide.

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    for (var r = sg; r < ROWS; r += nsg) {
        let row = row0 + r;
        if (row >= row_count()) {
            break;
        }
        run_row(row, lane, sg_size);
    }
}
