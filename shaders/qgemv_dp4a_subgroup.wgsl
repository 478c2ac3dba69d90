// Second-generation quantized GEMV (qdp4a.wgsl has the activation step, the
// weight dots and the split sum), finished by one subgroupAdd per row and, when
// the workgroup holds several subgroups, one pass through workgroup memory (a
// value per subgroup and row, one barrier). Needs SUBGROUP and a workgroup at
// least one subgroup wide. Includes: qdp4a.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override QFMT: u32 = 0u;
override VW: u32 = 4u;
override ACT: u32 = 8u;
override SPLIT: u32 = 1u;

var<workgroup> sg_part: array<f32, WG * ROWS>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32, @builtin(subgroup_id) sg: u32,
        @builtin(num_subgroups) nsg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let at = dq_group(wid, nwg);
    if (at.x >= dims.n) {
        return;
    }
    dq_accumulate(at.x, at.y, tid);
    for (var r = 0u; r < ROWS; r++) {
        let v = subgroupAdd(acc[r]);
        if (lane == 0u) {
            sg_part[sg * ROWS + r] = v;
        }
    }
    workgroupBarrier();
    if (tid < ROWS && at.x + tid < dims.n) {
        var total = 0.0;
        for (var i = 0u; i < nsg; i++) {
            total += sg_part[i * ROWS + tid];
        }
        dq_store(at.x + tid, at.y, total);
    }
}
