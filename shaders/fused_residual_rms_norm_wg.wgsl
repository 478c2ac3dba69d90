// Fused residual add + RMSNorm: h = x + r, y = h / sqrt(mean(h²) + eps) * w (or (1 + w)).
// One workgroup per row: every invocation strides over the row writing h and
// accumulating h², the workgroup reduces through workgroup memory, then every
// invocation rereads the h it wrote itself and writes y. Any dim; the norm weight
// is read as u32 words decoded by W_F16.
// Includes: rms.wgsl (row pieces), reduce_wg.wgsl (the tree), wload.wgsl (W_F16).

override WG: u32 = 128;

struct Dims { rows: u32, dim: u32, eps: f32, unit_offset: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> r: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> h: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> dims: Dims;

var<workgroup> partial: array<f32, WG>;

fn wload(i: u32) -> f32 { return wpick(w[wword(i)], i); }

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= dims.rows) {
        return;
    }
    let d = dims.dim;
    let base = row * d;
    var ss = 0.0;
    for (var c = tid; c < d; c += WG) {
        let v = x[base + c] + r[base + c];
        h[base + c] = v;
        ss += v * v;
    }
    let inv = rms_inv(wg_sum(tid, ss), d, dims.eps);
    let unit = dims.unit_offset != 0u;
    for (var c = tid; c < d; c += WG) {
        y[base + c] = h[base + c] * inv * rms_gain(wload(c), unit);
    }
}
