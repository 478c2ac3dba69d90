// The builtins of a subgroup kernel's entry point as one struct
// (`fn main(s: SgGrid)`): workgroup and grid, the invocation's subgroup, the
// workgroup's subgroup count, its lane and the subgroup size.
// Requires: grid.wgsl.

struct SgGrid {
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sg_size: u32,
}
