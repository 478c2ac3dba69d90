// Subgroup reductions with the signatures of reduce_wg.wgsl's row_sum and row_max,
// for the kernels that give each row a subgroup (`shader!(FILE, .., "reduce_sg.wgsl")`):
// a row body calling row_sum(v, first) serves a workgroup per row with
// reduce_wg.wgsl and a subgroup per row with this file. Needs SUBGROUP.

// The sum of v over the subgroup (lane: the invocation's subgroup_invocation_id).
fn row_sum(v: f32, lane: u32) -> f32 {
    return subgroupAdd(v);
}

// The maximum of v over the subgroup.
fn row_max(v: f32, lane: u32) -> f32 {
    return subgroupMax(v);
}
