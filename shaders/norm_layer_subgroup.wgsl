// LayerNorm with one subgroup per row and exact two-pass statistics: a subgroup
// sums its row (subgroupAdd) for the mean, rereads it for the centred sum of
// squares (subgroupAdd), then writes y = (x - mean) * rsqrt(var + eps) * w + b.
// ROWS rows per workgroup spread over its subgroups; no workgroup memory, no
// barriers. Any dim; needs SUBGROUP and a workgroup at least one subgroup wide.
// w and b are u32 words decoded by W_F16 (wload.wgsl).

override WG: u32 = 128;
override ROWS: u32 = 4;

struct Dims { rows: u32, dim: u32, eps: f32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

fn wload(i: u32) -> f32 { return wpick(w[wword(i)], i); }
fn bload(i: u32) -> f32 { return wpick(b[wword(i)], i); }

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    let d = dims.dim;
    for (var rr = sg; rr < ROWS; rr += nsg) {
        let row = row0 + rr;
        if (row >= dims.rows) {
            break;
        }
        let base = row * d;
        var sum = 0.0;
        for (var c = lane; c < d; c += sg_size) {
            sum += x[base + c];
        }
        let mean = subgroupAdd(sum) / f32(d);
        var sq = 0.0;
        for (var c = lane; c < d; c += sg_size) {
            let t = x[base + c] - mean;
            sq += t * t;
        }
        let rs = inverseSqrt(subgroupAdd(sq) / f32(d) + dims.eps);
        for (var c = lane; c < d; c += sg_size) {
            y[base + c] = (x[base + c] - mean) * rs * wload(c) + bload(c);
        }
    }
}
