// RMSNorm y = x / sqrt(mean(x²) + eps) * w (or * (1 + w) when unit_offset, Gemma),
// one workgroup per row: every invocation accumulates x² over a WG-strided slice of
// the row (coalesced scalar loads), the workgroup reduces the WG partial sums with a
// tree in workgroup memory, then every invocation rereads its slice and writes y.
// Any dim; the weight is read as u32 words decoded by W_F16 (f32 bits or f16 pairs).

override WG: u32 = 128;
override W_F16: bool = false;

struct Dims { rows: u32, dim: u32, eps: f32, unit_offset: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

var<workgroup> partial: array<f32, WG>;

fn wload(i: u32) -> f32 {
    if (W_F16) {
        let pair = unpack2x16float(w[i >> 1u]);
        return select(pair.x, pair.y, (i & 1u) == 1u);
    }
    return bitcast<f32>(w[i]);
}

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
        let v = x[base + c];
        ss += v * v;
    }
    partial[tid] = ss;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            partial[tid] += partial[tid + s];
        }
        workgroupBarrier();
    }
    let inv = inverseSqrt(partial[0] / f32(d) + dims.eps);
    let off = select(0.0, 1.0, dims.unit_offset != 0u);
    for (var c = tid; c < d; c += WG) {
        y[base + c] = x[base + c] * inv * (wload(c) + off);
    }
}
