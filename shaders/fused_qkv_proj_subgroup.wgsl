// Fused Q/K/V projection of one token with subgroup reductions and 16-byte loads:
// rows of the concatenated weight w[nq + 2 nkv, k] are owned by whole subgroups
// (ROWS rows per workgroup, spread over its subgroups), each lane loads 16 bytes per
// step and one subgroupAdd finishes the row; lane 0 adds the bias and routes the row
// to q, k_out or v_out. No workgroup memory, no barriers. Needs SUBGROUP and
// k % 4 == 0 (f32) or k % 8 == 0 (f16).
//
// Bindings: the bias is always bound at 2 (q, k_out, v_out at 3..5, uniform at 6);
// without a bias the host binds a small placeholder there and HAS_BIAS is false.
// Includes: qkv_store.wgsl (the routing), wload.wgsl (W_F16, 16-byte words).

override WG: u32 = 128;
override ROWS: u32 = 4;
override HAS_BIAS: bool = false;

struct Dims { k: u32, nq: u32, nkv: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> q: array<f32>;
@group(0) @binding(4) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_out: array<f32>;
@group(0) @binding(6) var<uniform> dims: Dims;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    let k = dims.k;
    let n = dims.nq + 2u * dims.nkv;
    let words = wwords16(k);
    for (var r = sg; r < ROWS; r += nsg) {
        let row = row0 + r;
        if (row >= n) { break; }
        var acc = 0.0;
        for (var c = lane; c < words; c += sg_size) {
            let xi = wx16(c);
            acc += wdot16(w[row * words + c], x[xi.x], x[xi.y]);
        }
        let total = subgroupAdd(acc);
        if (lane == 0u) {
            qkv_store(row, total);
        }
    }
}
