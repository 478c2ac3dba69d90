// GEMV y[n] = w[n,k] · x[k] reduced with subgroup operations: each subgroup owns
// whole rows (rows ROWS*wg + sg, + num_subgroups, ...), loads 16 bytes per lane
// per step and finishes with one subgroupAdd; no workgroup memory, no barriers.
// Needs SUBGROUP and k % 4 == 0 (f32) or k % 8 == 0 (f16).
// Includes: wload.wgsl (W_F16, 16-byte words).

override WG: u32 = 128;
override ROWS: u32 = 4;

struct Dims { n: u32, k: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    let words = wwords16(dims.k);
    for (var r = sg; r < ROWS; r += nsg) {
        let row = row0 + r;
        if (row >= dims.n) { break; }
        var acc = 0.0;
        for (var c = lane; c < words; c += sg_size) {
            let xi = wx16(c);
            acc += wdot16(w[row * words + c], x[xi.x], x[xi.y]);
        }
        let total = subgroupAdd(acc);
        if (lane == 0u) {
            y[row] = total;
        }
    }
}
