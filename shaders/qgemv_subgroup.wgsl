// Quantized GEMV y[n] = w[n,k] · x[k] reduced with subgroup operations: each
// subgroup owns whole rows (sg, sg + num_subgroups, ... of the workgroup's ROWS),
// its lanes stride over the row's quant words (dequantized in registers, QFMT
// selects q8_0 / q4_0 / q4_1) and one subgroupAdd finishes the row; no workgroup
// memory, no barriers. Needs SUBGROUP and k % 32 == 0.
//
// Bindings: x, the weight buffer twice (quants at 1, the scales region at 2), y,
// the uniform.

override WG: u32 = 128;
override ROWS: u32 = 4;
override QFMT: u32 = 0u;

struct Dims { n: u32, k: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> ws: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

// Includes: qblock.wgsl (block decoding: qwords, qscale, qdecode, qdot).

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    let wpr = dims.k / 32u * qwords();
    for (var r = sg; r < ROWS; r += nsg) {
        let row = row0 + r;
        if (row >= dims.n) { break; }
        var acc = 0.0;
        for (var wi = lane; wi < wpr; wi += sg_size) {
            acc += qdot(row * wpr, wi, 0u);
        }
        let total = subgroupAdd(acc);
        if (lane == 0u) {
            y[row] = total;
        }
    }
}
