// A compute entry point's position in its grid, shared by the shaders that take
// their builtins as one struct (`fn main(g: Grid)`): the workgroup, the grid and
// the invocation's index in its workgroup; and the linear index of a workgroup in
// a 1-D grid that `gpu::grid_2d` lays over x and y past 65535 workgroups, and of
// an invocation in it (`invocation`: the including shader's `override WG` is its
// workgroup size).

struct Grid {
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
}

fn wg_linear(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

fn invocation(g: Grid) -> u32 {
    return wg_linear(g.wid, g.nwg) * WG + g.lid;
}
