// Fused residual add + RMSNorm: h = x + r, y = h / sqrt(mean(h²) + eps) * w (or
// (1 + w)): the interface and the row body of residual_rms_norm_wg and
// residual_rms_norm_subgroup (`shader!(VARIANT, "fused_residual_rms_norm.wgsl",
// ..)`). The invocations of a row stride over it writing h and accumulating h², reduce
// (row_sum), then reread the h each wrote itself and write y. Any dim; the norm weight
// is read as u32 words decoded by W_F16 (wload.wgsl).
// Requires: rms_rows.wgsl, rms.wgsl.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> r: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> h: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> dims: Dims;

fn run_row(row: u32, first: u32, stride: u32) {
    let d = dims.dim;
    let base = row * d;
    var ss = 0.0;
    for (var c = first; c < d; c += stride) {
        let v = x[base + c] + r[base + c];
        h[base + c] = v;
        ss += v * v;
    }
    let inv = rms_inv(row_sum(ss, first), d, dims.eps);
    let unit = dims.unit_offset != 0u;
    for (var c = first; c < d; c += stride) {
        y[base + c] = h[base + c] * inv * rms_gain(wload(c), unit);
    }
}
