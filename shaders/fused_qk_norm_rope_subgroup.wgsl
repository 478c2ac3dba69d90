// Fused per-head RMSNorm + RoPE with one subgroup per (token, head): each workgroup
// owns HEADS consecutive heads, spread over its subgroups; a subgroup loads the head
// with lane-strided (coalesced) reads, reduces x² with one subgroupAdd and rotates
// the pairs lane-strided. No workgroup memory, no barriers. Any head_dim; needs
// SUBGROUP and a workgroup at least one subgroup wide.
// Includes: rms.wgsl (row pieces), rope.wgsl (angles, pairs), wload.wgsl (W_F16).

override WG: u32 = 64;
override HEADS: u32 = 2;

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

fn wload(i: u32) -> f32 { return wpick(w[wword(i)], i); }

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32) {
    let head0 = (wid.x + wid.y * nwg.x) * HEADS;
    let d = dims.head_dim;
    let half = dims.rot_half;
    let unit = dims.unit_offset != 0u;
    for (var hh = sg; hh < HEADS; hh += nsg) {
        let head = head0 + hh;
        if (head >= dims.tokens * dims.heads) {
            break;
        }
        let base = head * d;
        let inv = rms_inv(subgroupAdd(row_sumsq(base, lane, sg_size, d)), d, dims.eps);
        let pos = dims.pos0 + head / dims.heads;
        for (var i = lane; i < half; i += sg_size) {
            let p = rope_dims(i, half, dims.interleaved == 1u);
            let r = rope_rotate(rms_at(base, p.x, inv, unit), rms_at(base, p.y, inv, unit), rope_cs(pos, inv_freq[i]));
            y[base + p.x] = r.x;
            y[base + p.y] = r.y;
        }
        rms_write(base, 2u * half, lane, sg_size, d, inv, unit);
    }
}
