// Paged batch attention, one invocation per (query row, head): a per-key online
// softmax over the keys of the row's sequence read block by block through
// attention_paged.wgsl's cache_row, the row's accumulator in registers (HD <= 4 *
// MAX_VEC4, checked on the host). Every workgroup of WG rows streams their keys on
// its own: no workgroup memory, no barrier.
// Requires: attention_dims.wgsl, attention_paged.wgsl, attention.wgsl, wload.wgsl.

override WG: u32 = 64;
override HD: u32 = 64;        // head_dim, specialised by the host

const MAX_VEC4: u32 = 64u;

@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = gid.x + gid.y * nwg.x * WG;
    if (n >= dims.tokens * dims.heads) {
        return;
    }
    let h = n % dims.heads;
    let kh = kv_head(h, dims.heads, dims.kv_heads);
    let at = locate(n / dims.heads);
    let words = wwords16(HD);
    let qr = n * (HD / 4u);
    var acc: array<vec4<f32>, MAX_VEC4>;
    for (var i = 0u; i < HD / 4u; i++) {
        acc[i] = vec4<f32>(0.0);
    }
    var m = NEG;
    var l = 0.0;
    for (var j = first_key(at.x, dims.window); j <= at.x; j++) {
        let row = cache_row(kh, j) * words;
        var s4 = vec4<f32>(0.0);
        for (var c = 0u; c < words; c++) {
            let qi = wx16(c);
            s4 += kv_mul16(k_word(row + c), q[qr + qi.x], q[qr + qi.y]);
        }
        let s = (s4.x + s4.y + s4.z + s4.w) * dims.scale;
        let m_new = max(m, s);
        let alpha = exp(m - m_new);
        let p = exp(s - m_new);
        l = l * alpha + p;
        for (var c = 0u; c < words; c++) {
            let w = v_word(row + c);
            let qi = wx16(c);
            acc[qi.x] = acc[qi.x] * alpha + p * w.lo;
            if (W_F16) {
                acc[qi.y] = acc[qi.y] * alpha + p * w.hi;
            }
        }
        m = m_new;
    }
    let inv = 1.0 / l;
    for (var i = 0u; i < HD / 4u; i++) {
        let o = n * HD + 4u * i;
        out[o] = acc[i].x * inv;
        out[o + 1u] = acc[i].y * inv;
        out[o + 2u] = acc[i].z * inv;
        out[o + 3u] = acc[i].w * inv;
    }
}
