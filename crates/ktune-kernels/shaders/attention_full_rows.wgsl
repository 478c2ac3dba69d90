// Bidirectional attention (every query sees every key; the SigLIP encoder), one
// invocation per (query, head) row, exact two-pass softmax: the row maximum of the
// scores first, then exp(s - max), their sum and the weighted sum of values in
// registers, divided at the end. q, k, v and out are [tokens, heads, head_dim] f32,
// read as vec4 (head_dim % 4 == 0, at most 4 * 32). Linear row index over a 2D
// grid (`wid.x + wid.y * nwg.x`). Bindings: attention_full.wgsl.
// Requires: attention_full.wgsl.

override WG: u32 = 64;

fn score(qb: u32, kb: u32) -> f32 {
    var s = 0.0;
    for (var d = 0u; d < dims.hd4; d++) {
        s += dot(q[qb + d], k[kb + d]);
    }
    return s * dims.scale;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = (wid.x + wid.y * nwg.x) * WG + lid;
    let heads = dims.heads;
    if (r >= dims.tokens * heads) {
        return;
    }
    let h = r % heads;
    let hd4 = dims.hd4;
    let qb = r * hd4;
    var m = -3.0e38;
    for (var j = 0u; j < dims.tokens; j++) {
        m = max(m, score(qb, (j * heads + h) * hd4));
    }
    var acc: array<vec4<f32>, 32>;
    for (var d = 0u; d < hd4; d++) {
        acc[d] = vec4<f32>(0.0);
    }
    var z = 0.0;
    for (var j = 0u; j < dims.tokens; j++) {
        let kb = (j * heads + h) * hd4;
        let p = exp(score(qb, kb) - m);
        z += p;
        for (var d = 0u; d < hd4; d++) {
            acc[d] += p * v[kb + d];
        }
    }
    let inv = 1.0 / z;
    for (var d = 0u; d < hd4; d++) {
        out[qb + d] = acc[d] * inv;
    }
}
