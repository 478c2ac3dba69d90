// Decode attention, one workgroup per query head streaming its KV head's cache
// (attention_stream.wgsl's stream_row over the head-major rows kh * kv_cap + j).
// One query at position kv_len - 1 sees keys [lo, kv_len) (lo > 0 with a sliding
// window); cache rows at or past kv_len are never read.
// K/V are u32 words decoded by W_F16: one vec4<u32> holds 4 f32 or 8 packed f16,
// so head_dim % 4 == 0 (f32) or % 8 == 0 (f16), checked on the host. HD is the
// head dimension, specialised by the host; WG must be a power of two.
// Heads: attention_decode_head.wgsl (WG, HD), attention_dims.wgsl (W_F16, Dims).
// Includes: attention_stream.wgsl (the row), attention.wgsl, reduce_wg.wgsl (the
// trees), wload.wgsl (W_F16, 16-byte words).
// Requires: attention_decode_head.wgsl, attention_dims.wgsl, attention_stream.wgsl, attention.wgsl, position.wgsl, reduce_wg.wgsl.

override KPT: u32 = 2;

@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn cache_row(kh: u32, j: u32) -> u32 {
    return kh * dims.kv_cap + j;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let h = wid.x + wid.y * nwg.x;
    if (h >= dims.heads) {
        return;
    }
    let hi = position.kv_len;
    stream_row(h, kv_head(h, dims.heads, dims.kv_heads), first_key(hi - 1u, dims.window), hi, tid);
}
