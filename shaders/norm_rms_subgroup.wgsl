// RMSNorm with one subgroup per row: a workgroup owns ROWS rows spread over its
// subgroups; a subgroup streams its row with lane-strided (coalesced) loads,
// reduces x² with one subgroupAdd, then writes y = x * inv_rms * w (or (1 + w)).
// No workgroup memory, no barriers: suited to many short rows (prefill). Any dim;
// needs SUBGROUP and a workgroup at least one subgroup wide.

override WG: u32 = 128;
override ROWS: u32 = 4;
override W_F16: bool = false;

struct Dims { rows: u32, dim: u32, eps: f32, unit_offset: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

fn wload(i: u32) -> f32 {
    if (W_F16) {
        let pair = unpack2x16float(w[i >> 1u]);
        return select(pair.x, pair.y, (i & 1u) == 1u);
    }
    return bitcast<f32>(w[i]);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    let d = dims.dim;
    let off = select(0.0, 1.0, dims.unit_offset != 0u);
    for (var rr = sg; rr < ROWS; rr += nsg) {
        let row = row0 + rr;
        if (row >= dims.rows) {
            break;
        }
        let base = row * d;
        var ss = 0.0;
        for (var c = lane; c < d; c += sg_size) {
            let v = x[base + c];
            ss += v * v;
        }
        let inv = inverseSqrt(subgroupAdd(ss) / f32(d) + dims.eps);
        for (var c = lane; c < d; c += sg_size) {
            y[base + c] = x[base + c] * inv * (wload(c) + off);
        }
    }
}
