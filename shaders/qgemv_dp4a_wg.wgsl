// Second-generation quantized GEMV (qdp4a.wgsl has the activation step, the
// weight dots and the split sum), finished by one workgroup tree reduction: each
// invocation leaves its ROWS register accumulators in workgroup memory once, after
// its whole share of the row (no workgroup-memory adds in the inner loop).
// Includes: qdp4a.wgsl, reduce_wg.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override QFMT: u32 = 0u;
override VW: u32 = 4u;
override ACT: u32 = 8u;
override SPLIT: u32 = 1u;

var<workgroup> partial: array<f32, WG * ROWS>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let at = dq_group(wid, nwg);
    if (at.x >= dims.n) {
        return;
    }
    dq_accumulate(at.x, at.y, tid);
    for (var r = 0u; r < ROWS; r++) {
        partial[r * WG + tid] = acc[r];
    }
    wg_sum_rows(tid, ROWS);
    if (tid < ROWS && at.x + tid < dims.n) {
        dq_store(at.x + tid, at.y, partial[tid * WG]);
    }
}
