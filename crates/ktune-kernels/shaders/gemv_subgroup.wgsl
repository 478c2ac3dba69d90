// GEMV y[n] = w[n,k] · x[k] reduced with subgroup operations: each subgroup owns
// whole rows (row_sg.wgsl: ROWS per workgroup, spread over its subgroups), loads 16
// bytes per lane per step and finishes with one subgroupAdd; no workgroup memory, no
// barriers. Needs SUBGROUP and k % 4 == 0 (f32) or k % 8 == 0 (f16).
// Includes: row_dot16.wgsl (the lane dot), gemv16.wgsl (bindings), row_sg.wgsl (entry point), reduce_sg.wgsl, wload.wgsl (W_F16, 16-byte
// words).

override WG: u32 = 128;
override ROWS: u32 = 4;
override UNROLL: u32 = 1u; // words a lane loads before using any (row_dot16)
override W_F16: bool = false;

fn run_row(row: u32, lane: u32, stride: u32) {
    let total = row_sum(row_dot16(row, lane, stride), lane);
    if (lane == 0u) {
        y[row] = total;
    }
}
