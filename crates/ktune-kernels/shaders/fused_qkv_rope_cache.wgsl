// One decode token's fused Q/K/V row split, q and k rotated (RMS-normed per head
// first when `norm`: Gemma 3's q/k norm) and k and v written into row pos0 of the
// head-major caches, in one dispatch: the rows of qkv[heads + 2 kv_heads, head_dim]
// (q heads, k heads, v heads, as the fused QKV projection writes them) get one
// workgroup each. A q or k row reduces x² over the workgroup (norm only), then each
// invocation normalizes and rotates whole pairs (i, i + rot/2) or (2i, 2i + 1) into
// workgroup memory (dims past rot_dim only normalized; a v row is copied), and after
// a barrier the row is stored: q into y, k and v into the caches as f32 bits or, when
// KV_F16, packed f16 pairs (so a pair is written by one invocation whatever the
// rotary layout). pos0 is position.wgsl's (the same program serves every position).
// The gains (q_norm, k_norm) are u32 words decoded by W_F16 (wload.wgsl); without
// norm the host binds inv_freq in their place, unread. Bindings 0-6 the buffers,
// 7 the position, 8 the uniform block. head_dim <= MAX_D, even.
// Includes: rotary.wgsl (angles, pairs), reduce_wg.wgsl (row_sum), wload.wgsl,
// position.wgsl.
// Requires: rotary.wgsl, reduce_wg.wgsl, wload.wgsl, position.wgsl.

override WG: u32 = 64;
override W_F16: bool = false;
override KV_F16: bool = false;
override MAX_D: u32 = 256;

struct Fused {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    rot_half: u32,
    kv_cap: u32,
    interleaved: u32,
    norm: u32,        // 1: q and k heads RMS-normed before the rotation
    unit_offset: u32, // 1: scale by (1 + g) (Gemma)
    eps: f32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> q_norm: array<u32>;
@group(0) @binding(2) var<storage, read> k_norm: array<u32>;
@group(0) @binding(3) var<storage, read> inv_freq: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<u32>;
@group(0) @binding(8) var<uniform> fd: Fused;

var<workgroup> partial: array<f32, WG>;
var<workgroup> row_vals: array<f32, MAX_D>;

// Gain c of a q (is_k false) or k head, as applied: g, or 1 + g (unit_offset).
fn gain(is_k: bool, c: u32) -> f32 {
    var g: f32;
    if (is_k) {
        g = wpick(k_norm[wword(c)], c);
    } else {
        g = wpick(q_norm[wword(c)], c);
    }
    return select(g, 1.0 + g, fd.unit_offset != 0u);
}

// Cache word holding element c of kv head h's row at pos0 (two elements a word when KV_F16).
fn cache_word(h: u32, c: u32) -> u32 {
    let e = (h * fd.kv_cap + position.pos0) * fd.head_dim + c;
    return select(e, e >> 1u, KV_F16);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row = wid.x + wid.y * nwg.x;
    let nkv = fd.kv_heads;
    if (row >= fd.heads + 2u * nkv) {
        return;
    }
    let d = fd.head_dim;
    let base = row * d;
    let is_v = row >= fd.heads + nkv;
    let is_k = row >= fd.heads && !is_v;
    if (is_v) {
        for (var c = tid; c < d; c += WG) {
            row_vals[c] = x[base + c];
        }
    } else {
        let norm = fd.norm != 0u;
        var inv = 1.0;
        if (norm) {
            var ss = 0.0;
            for (var c = tid; c < d; c += WG) {
                let v = x[base + c];
                ss += v * v;
            }
            inv = inverseSqrt(row_sum(ss, tid) / f32(d) + fd.eps);
        }
        let half = fd.rot_half;
        let pos = position.pos0;
        for (var i = tid; i < half; i += WG) {
            let p = rope_dims(i, half, fd.interleaved == 1u);
            var a = x[base + p.x];
            var b = x[base + p.y];
            if (norm) {
                a *= inv * gain(is_k, p.x);
                b *= inv * gain(is_k, p.y);
            }
            let r = rope_rotate(a, b, rope_cs(pos, inv_freq[i]));
            row_vals[p.x] = r.x;
            row_vals[p.y] = r.y;
        }
        for (var c = 2u * half + tid; c < d; c += WG) {
            var a = x[base + c];
            if (norm) {
                a *= inv * gain(is_k, c);
            }
            row_vals[c] = a;
        }
    }
    workgroupBarrier();
    if (row < fd.heads) {
        for (var c = tid; c < d; c += WG) {
            y[base + c] = row_vals[c];
        }
        return;
    }
    let h = select(row - fd.heads, row - fd.heads - nkv, is_v);
    if (KV_F16) {
        for (var c = 2u * tid; c < d; c += 2u * WG) {
            let word = pack2x16float(vec2<f32>(row_vals[c], row_vals[c + 1u]));
            if (is_v) {
                v_cache[cache_word(h, c)] = word;
            } else {
                k_cache[cache_word(h, c)] = word;
            }
        }
    } else {
        for (var c = tid; c < d; c += WG) {
            let word = bitcast<u32>(row_vals[c]);
            if (is_v) {
                v_cache[cache_word(h, c)] = word;
            } else {
                k_cache[cache_word(h, c)] = word;
            }
        }
    }
}
