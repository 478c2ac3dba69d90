// RMSNorm y = x / sqrt(mean(x²) + eps) * w (or * (1 + w) when unit_offset, Gemma),
// one workgroup per row: every invocation accumulates x² over a WG-strided slice of
// the row (coalesced scalar loads), the workgroup reduces the WG partial sums with a
// tree in workgroup memory, then every invocation rereads its slice and writes y.
// Any dim; the weight is read as u32 words decoded by W_F16 (f32 bits or f16 pairs).
// Includes: rms.wgsl (row pieces), reduce_wg.wgsl (the tree), wload.wgsl (W_F16).

override WG: u32 = 128;

struct Dims { rows: u32, dim: u32, eps: f32, unit_offset: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

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
    let inv = rms_inv(wg_sum(tid, row_sumsq(base, tid, WG, d)), d, dims.eps);
    rms_write(base, 0u, tid, WG, d, inv, dims.unit_offset != 0u);
}
