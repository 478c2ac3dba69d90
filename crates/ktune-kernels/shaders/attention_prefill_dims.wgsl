// Head of the WGSL prefill attention kernels (attention_prefill_naive,
// attention_prefill_flash, flash2.wgsl, attn_mma.wgsl): the K/V word format and
// the uniform block, whose words are Shape::prefill_words (kernels/attention) and
// then one word of the kernel's own. The q, k_cache, v_cache and dims bindings are
// attention.wgsl's.

override W_F16: bool = false; // K/V as 16-byte words of 4 f32 or 8 packed f16 (wload.wgsl)

struct Dims {
    tokens: u32,
    kv_len: u32,
    kv_cap: u32,
    heads: u32,
    kv_heads: u32,
    window: u32,
    scale: f32,
    // the bidirectional block [b0, b1) (b0 == b1: none)
    b0: u32,
    b1: u32,
    // the kernel's own word (naive: head_dim; flash2: workgroups per KV head along
    // y; zero padding for the others)
    own: u32,
}
