// RMSNorm with 16-byte loads and the row kept in registers: one workgroup per row;
// invocation `tid` loads vec4s tid, tid + WG, ... (VPT of them at most) once, the
// workgroup reduces x² through workgroup memory, and y is written from the
// registers: x is read from memory exactly once. Needs dim % 4 == 0 and
// dim <= 4 * WG * VPT (checked on the host); VPT <= 8.
// Includes: reduce_wg.wgsl (the tree), wload.wgsl (W_F16).

override WG: u32 = 128;
override VPT: u32 = 4;
override W_F16: bool = false;

struct Dims { rows: u32, dim: u32, eps: f32, unit_offset: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> dims: Dims;

var<workgroup> partial: array<f32, WG>;

// Weights 4q .. 4q + 3.
fn wload4(q: u32) -> vec4<f32> {
    if (W_F16) {
        return vec4<f32>(unpack2x16float(w[2u * q]), unpack2x16float(w[2u * q + 1u]));
    }
    let i = 4u * q;
    return vec4<f32>(bitcast<f32>(w[i]), bitcast<f32>(w[i + 1u]), bitcast<f32>(w[i + 2u]), bitcast<f32>(w[i + 3u]));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= dims.rows) {
        return;
    }
    let d4 = dims.dim / 4u;
    let base = row * d4;
    var v: array<vec4<f32>, 8>;
    var ss = 0.0;
    for (var k = 0u; k < VPT; k++) {
        let q = tid + k * WG;
        if (q < d4) {
            v[k] = x[base + q];
            ss += dot(v[k], v[k]);
        }
    }
    let inv = inverseSqrt(row_sum(ss, tid) / f32(dims.dim) + dims.eps);
    let off = select(0.0, 1.0, dims.unit_offset != 0u);
    for (var k = 0u; k < VPT; k++) {
        let q = tid + k * WG;
        if (q < d4) {
            y[base + q] = v[k] * inv * (wload4(q) + off);
        }
    }
}
