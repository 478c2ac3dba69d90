// Entry point `main` of the second-generation quantized projections (qdp4a.wgsl)
// finished by one subgroupAdd per accumulator and, when the workgroup holds several
// subgroups, one pass through workgroup memory (a value per subgroup and
// accumulator, one barrier), then invocation r < ROWS stores output r through the
// family's dq_out (`shader!(head "qdp4a_head.wgsl"; FAMILY, "qdp4a_main_sg.wgsl",
// "qdp4a.wgsl", ..)`). Needs SUBGROUP and a workgroup at least one subgroup wide.
// Uses the head's `override WG`, `ROWS` and the family's DQ_SETS.
// Requires: qdp4a.wgsl.

// The subgroups' totals, subgroup s's accumulator r at sg_part[s * dq_nacc() + r].
var<workgroup> sg_part: array<f32, DQ_SETS * WG * ROWS>;

// The workgroup totals of the accumulators (at most 16).
var<workgroup> dq_tot: array<f32, 16>;

// Accumulator r's workgroup total.
fn dq_total(r: u32) -> f32 {
    return dq_tot[r];
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32, @builtin(subgroup_id) sg: u32,
        @builtin(num_subgroups) nsg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let at = dq_start(wid, nwg, tid);
    if (at.x >= dq_nrows()) {
        return;
    }
    let nacc = dq_nacc();
    for (var r = 0u; r < nacc; r++) {
        let v = subgroupAdd(acc[r]);
        if (lane == 0u) {
            sg_part[sg * nacc + r] = v;
        }
    }
    workgroupBarrier();
    if (tid < nacc) {
        var total = 0.0;
        for (var i = 0u; i < nsg; i++) {
            total += sg_part[i * nacc + tid];
        }
        dq_tot[tid] = total;
    }
    workgroupBarrier();
    if (tid < ROWS) {
        dq_out(at.x, at.y, tid);
    }
}
