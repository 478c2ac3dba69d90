// Fused residual add + RMSNorm with one subgroup per row: each workgroup owns ROWS
// rows spread over its subgroups; a subgroup streams its row with lane-strided
// (coalesced) loads, writing h = x + r and accumulating h², reduces with one
// subgroupAdd, then rereads its own h and writes y = h * inv_rms * w (or (1 + w)).
// No workgroup memory, no barriers: suited to short rows and many of them. Any dim;
// needs SUBGROUP and a workgroup at least one subgroup wide.
// Includes: rms.wgsl (row pieces), wload.wgsl (W_F16).

override WG: u32 = 128;
override ROWS: u32 = 4;

struct Dims { rows: u32, dim: u32, eps: f32, unit_offset: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> r: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> h: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> dims: Dims;

fn wload(i: u32) -> f32 { return wpick(w[wword(i)], i); }

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    let d = dims.dim;
    let unit = dims.unit_offset != 0u;
    for (var rr = sg; rr < ROWS; rr += nsg) {
        let row = row0 + rr;
        if (row >= dims.rows) { break; }
        let base = row * d;
        var ss = 0.0;
        for (var c = lane; c < d; c += sg_size) {
            let v = x[base + c] + r[base + c];
            h[base + c] = v;
            ss += v * v;
        }
        let inv = rms_inv(subgroupAdd(ss), d, dims.eps);
        for (var c = lane; c < d; c += sg_size) {
            y[base + c] = h[base + c] * inv * rms_gain(wload(c), unit);
        }
    }
}
