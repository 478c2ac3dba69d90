// Head of the WGSL attention kernels, prefill (attention_prefill_naive,
// attention_prefill_flash, flash2.wgsl, attn_mma.wgsl) and decode (after
// attention_decode_head.wgsl): the K/V word format and the uniform block, whose
// words are Shape::prefill_words (kernels/attention; a decode call is one token
// with no bidirectional block) and then the kernel's own words. The q, k_cache,
// v_cache and dims bindings are attention.wgsl's.

override W_F16: bool = false; // K/V as 16-byte words of 4 f32 or 8 packed f16 (wload.wgsl)
// K/V as q8_0 blocks (attention.wgsl's k_word / v_word; W_F16 set too: 8 values a
// word): a pool's int8 codes, then the blocks' f16 scales from u32 word `own2` on
// (the single-buffer layout of a q8_0 matrix, kernels::quant::QMatrix::gpu_bytes).
override KV_Q8: bool = false;

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
    // the kernel's own words (naive: head_dim; flash2: workgroups per KV head along
    // y; split-KV decode: workgroups per KV head along x, where the partials'
    // (max, sum) pairs start; paged: the width of a table row, with KV_Q8 the
    // pools' first scale word; zero padding for the others)
    own: u32,
    own2: u32,
}
