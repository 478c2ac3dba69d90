// Head of the WGSL decode attention kernels (attention_decode_stream,
// attention_decode_splitkv, attention_decode_splitkv_sg): the overrides they share,
// the K/V word format and the uniform block (kernels/attention's decode words; the
// streaming kernel passes the first six). The q, k_cache, v_cache and dims bindings
// are attention.wgsl's.

override WG: u32 = 128;
override HD: u32 = 64;        // head_dim, specialised by the host
override W_F16: bool = false; // K/V as 16-byte words of 4 f32 or 8 packed f16 (wload.wgsl)

struct Dims {
    kv_len: u32,
    kv_cap: u32,
    heads: u32,
    kv_heads: u32,
    window: u32,
    scale: f32,
    // split-KV: workgroups per KV head along x (head subgroups of GH heads), and
    // where the partials' (max, sum) pairs start in `part`
    nsub: u32,
    ml_off: u32,
}
