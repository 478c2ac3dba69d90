// RMSNorm y = x / sqrt(mean(x²) + eps) * w (or * (1 + w) when unit_offset, Gemma):
// the interface and the row body of norm_rms_wg and norm_rms_subgroup, which differ
// only in who shares a row (`shader!(VARIANT, "norm_rms.wgsl", ..)`). The invocations
// of a row accumulate x² over their strided share (coalesced scalar loads), reduce it
// (row_sum), then reread their share and write y. Any dim; the weight is read as u32
// words decoded by W_F16 (wload.wgsl).
// Requires: rms_rows.wgsl, rms.wgsl.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

fn run_row(row: u32, first: u32, stride: u32) {
    let base = row * dims.dim;
    let inv = rms_row_inv(base, first, stride, dims.dim, dims.eps);
    rms_write(base, 0u, first, stride, dims.dim, inv, dims.unit_offset != 0u);
}
