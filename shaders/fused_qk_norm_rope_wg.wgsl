// Fused per-head RMSNorm + RoPE (Gemma 3's q/k norm): one workgroup per (token, head).
// Every invocation accumulates x² over a stride of the head, the workgroup reduces
// the partial sums through workgroup memory, then each invocation normalizes and
// rotates whole pairs (i, i + rot/2) or (2i, 2i + 1), so both elements of a pair are
// read and written by the same invocation; dims past rot_dim are only normalized.
// Any head_dim; the norm weight is read as u32 words decoded by W_F16.
// Includes: rms.wgsl (row pieces), rope.wgsl (angles, pairs), reduce_wg.wgsl (the
// tree), wload.wgsl (W_F16).

override WG: u32 = 64;

struct Dims {
    tokens: u32,
    heads: u32,
    head_dim: u32,
    rot_half: u32,
    pos0: u32,
    interleaved: u32, // 0 rotate-half pairs (i, i + rot/2), 1 interleaved (2i, 2i + 1)
    eps: f32,
    unit_offset: u32, // 1: scale by (1 + w) (Gemma)
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> inv_freq: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

var<workgroup> partial: array<f32, WG>;

fn wload(i: u32) -> f32 { return wpick(w[wword(i)], i); }

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let head = wid.x + wid.y * nwg.x; // token * heads + h
    if (head >= dims.tokens * dims.heads) {
        return;
    }
    let d = dims.head_dim;
    let base = head * d;
    let inv = rms_inv(wg_sum(tid, row_sumsq(base, tid, WG, d)), d, dims.eps);
    let pos = dims.pos0 + head / dims.heads;
    let half = dims.rot_half;
    let unit = dims.unit_offset != 0u;
    for (var i = tid; i < half; i += WG) {
        let p = rope_dims(i, half, dims.interleaved == 1u);
        let r = rope_rotate(rms_at(base, p.x, inv, unit), rms_at(base, p.y, inv, unit), rope_cs(pos, inv_freq[i]));
        y[base + p.x] = r.x;
        y[base + p.y] = r.y;
    }
    rms_write(base, 2u * half, tid, WG, d, inv, unit);
}
