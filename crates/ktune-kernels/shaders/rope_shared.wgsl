// Rotary position embedding with one workgroup per (token, group of HEADS heads):
// the workgroup first computes cos and sin of each of the rot/2 frequencies once
// into workgroup memory, then rotates the pairs of all its heads from that table,
// so the trig work is shared by HEADS heads (decode: all heads of the token in a
// few workgroups; prefill: many tokens). HALF_CAP >= rot/2 sizes the table (set by
// the host from the problem). Pairs: (i, i + rot/2) or (2i, 2i + 1); dims past
// rot_dim copied. Includes: rope.wgsl (interface), rotary.wgsl (the exactly reduced
// angles, the pairs, the rotation).

override WG: u32 = 64;
override HEADS: u32 = 4;
override HALF_CAP: u32 = 64;

var<workgroup> cs: array<vec2<f32>, HALF_CAP>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let group = wid.x + wid.y * nwg.x;
    let per_token = (dims.heads + HEADS - 1u) / HEADS;
    let token = group / per_token;
    if (token >= dims.tokens) {
        return;
    }
    let h0 = (group % per_token) * HEADS;
    let d = dims.head_dim;
    let half = dims.rot_half;
    let pos = row_position(token);
    for (var i = tid; i < half; i += WG) {
        cs[i] = rope_cs(pos, inv_freq[i]);
    }
    workgroupBarrier();
    let nh = min(HEADS, dims.heads - h0);
    let slots = d - half;
    for (var j = tid; j < nh * slots; j += WG) {
        let slot = j % slots;
        let base = (token * dims.heads + h0 + j / slots) * d;
        if (slot < half) {
            let p = base + rope_dims(slot, half, dims.interleaved == 1u);
            let r = rope_rotate(x[p.x], x[p.y], cs[slot]);
            y[p.x] = r.x;
            y[p.y] = r.y;
        } else {
            let c = slot + half;
            y[base + c] = x[base + c];
        }
    }
}
