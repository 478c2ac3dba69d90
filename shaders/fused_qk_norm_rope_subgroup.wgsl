// Fused per-head RMSNorm + RoPE with one subgroup per (token, head): each workgroup
// owns HEADS consecutive heads, spread over its subgroups; a subgroup loads the head
// with lane-strided (coalesced) reads, reduces x² with one subgroupAdd and rotates
// the pairs lane-strided. No workgroup memory, no barriers. Needs SUBGROUP and a
// workgroup at least one subgroup wide.
// Includes: fused_qk_norm_rope.wgsl (interface, head body), reduce_sg.wgsl, rms.wgsl,
// rotary.wgsl, wload.wgsl.

override WG: u32 = 64;
override HEADS: u32 = 2;
override W_F16: bool = false;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    let head0 = (wid.x + wid.y * nwg.x) * HEADS;
    for (var hh = sg; hh < HEADS; hh += nsg) {
        let head = head0 + hh;
        if (head >= row_count()) {
            break;
        }
        run_row(head, lane, sg_size);
    }
}
