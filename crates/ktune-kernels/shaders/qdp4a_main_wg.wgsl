// Entry point `main` of the second-generation quantized projections (qdp4a.wgsl)
// finished by one workgroup tree reduction (`shader!(head "qdp4a_head.wgsl"; FAMILY,
// "qdp4a_main_wg.wgsl", "qdp4a.wgsl", "reduce_wg.wgsl", ..)`): each invocation
// leaves its dq_nacc() register accumulators in workgroup memory once, after its
// whole share of the rows (no workgroup-memory adds in the inner loop), the tree
// sums them, and invocation r < ROWS stores output r through the family's dq_out.
// Uses the head's `override WG`, `ROWS` and the family's DQ_SETS.
// Requires: qdp4a.wgsl, reduce_wg.wgsl.

// The accumulators' partials, accumulator r's at partial[r * WG ..] (reduce_wg.wgsl).
var<workgroup> partial: array<f32, DQ_SETS * WG * ROWS>;

// Accumulator r's workgroup total (after the tree).
fn dq_total(r: u32) -> f32 {
    return partial[r * WG];
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let at = dq_start(wid, nwg, tid);
    if (at.x >= dq_nrows()) {
        return;
    }
    let nacc = dq_nacc();
    for (var r = 0u; r < nacc; r++) {
        partial[r * WG + tid] = acc[r];
    }
    wg_sum_rows(tid, nacc);
    if (tid < ROWS) {
        dq_out(at.x, at.y, tid);
    }
}
