// Fused per-head RMSNorm + RoPE (Gemma 3's q/k norm): the interface and the per-head
// body of fused_qk_norm_rope_wg and fused_qk_norm_rope_subgroup
// (`shader!(VARIANT, "fused_qk_norm_rope.wgsl", ..)`), which differ only in who
// shares a head. The invocations of a head accumulate x² over their strided share,
// reduce it (row_sum), then each normalizes and rotates whole pairs (i, i + rot/2)
// or (2i, 2i + 1), so both elements of a pair are read and written by the same
// invocation; dims past rot_dim are only normalized. Any head_dim; the norm weight
// is read as u32 words decoded by W_F16 (wload.wgsl). The uniform block is
// rotary.wgsl's Dims; a row's position is position.wgsl's `row_position`.
// Requires: rotary.wgsl, rms.wgsl, wload.wgsl, position.wgsl.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> inv_freq: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

fn wload(i: u32) -> f32 { return wpick(w[wword(i)], i); }

// Rows: (token, head) pairs, head row = token * heads + h.
fn row_count() -> u32 {
    return dims.tokens * dims.heads;
}

fn run_row(head: u32, first: u32, stride: u32) {
    let d = dims.head_dim;
    let base = head * d;
    let inv = rms_row_inv(base, first, stride, d, dims.eps);
    let pos = row_position(head / dims.heads);
    let half = dims.rot_half;
    let unit = dims.unit_offset != 0u;
    for (var i = first; i < half; i += stride) {
        let p = rope_dims(i, half, dims.interleaved == 1u);
        let r = rope_rotate(rms_at(base, p.x, inv, unit), rms_at(base, p.y, inv, unit), rope_cs(pos, inv_freq[i]));
        y[base + p.x] = r.x;
        y[base + p.y] = r.y;
    }
    rms_write(base, 2u * half, first, stride, d, inv, unit);
}
