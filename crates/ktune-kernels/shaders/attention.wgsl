// Pieces shared by the attention shaders (`shader!(head HEAD; FILE, ..,
// "attention.wgsl")`): the query and K/V cache bindings and the uniform block of
// their head's `struct Dims` (attention_dims.wgsl or
// attention_dims.wgsl), and pure functions. K/V cache rows are read with
// wload.wgsl's 16-byte words. Bindings: q@0 k_cache@1 v_cache@2 dims@4 (out@3 and
// the scratch buffers are the shader's).
// Requires: wload.wgsl.

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> kc: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> vc: array<vec4<u32>>;
@group(0) @binding(4) var<uniform> dims: Dims;

// The query heads a workgroup of a GQA-grouped kernel owns: workgroup x of nsub per
// KV head takes heads g0 .. g0 + gh of KV head kh's group (g0 = (x % nsub) gh):
// (kh, its first query head h0, how many ng of them exist).
fn head_block(x: u32, nsub: u32, gh: u32, heads: u32, kv_heads: u32) -> vec3<u32> {
    let group = heads / kv_heads;
    let kh = x / nsub;
    let g0 = (x % nsub) * gh;
    return vec3<u32>(kh, kh * group + g0, min(gh, group - g0));
}

// Finite stand-in for -inf (masked scores, an empty running softmax state).
const NEG: f32 = -3.0e38;

// First key the query at position `pos` sees: keys (pos - window, pos], every key up
// to pos when window == 0.
fn first_key(pos: u32, window: u32) -> u32 {
    if (window > 0u && pos + 1u > window) {
        return pos + 1u - window;
    }
    return 0u;
}

// Keys [key_lo, key_hi] (bounds included) the prefill query at position `pos` sees:
// first_key..pos, widened to the whole bidirectional block [b0, b1) (an image's
// tokens; b0 == b1: none) when pos lies in it. Neither bound decreases with pos.
fn key_lo(pos: u32, window: u32, b0: u32, b1: u32) -> u32 {
    let lo = first_key(pos, window);
    if (pos >= b0 && pos < b1) {
        return min(lo, b0);
    }
    return lo;
}

fn key_hi(pos: u32, b0: u32, b1: u32) -> u32 {
    if (pos >= b0 && pos < b1) {
        return b1 - 1u;
    }
    return pos;
}

// A lane's share of an output row is the elements of one 16-byte cache word
// (`word_elems`: 4, or 8 when W_F16) held in two vectors, a0 elements 0..4 and a1
// 4..8; `word_elem` is element e of them.
fn word_elems() -> u32 {
    return select(4u, 8u, W_F16);
}

fn word_elem(a0: vec4<f32>, a1: vec4<f32>, e: u32) -> f32 {
    return select(a1[e & 3u], a0[e & 3u], e < 4u);
}

// The keys [x, y] the prefill query at position pos sees, and [z, w]: those any
// query of a block at positions first..=last sees (the range its key tiles cover).
fn key_span(pos: u32, first: u32, last: u32) -> vec4<u32> {
    return vec4<u32>(key_lo(pos, dims.window, dims.b0, dims.b1), key_hi(pos, dims.b0, dims.b1),
                     key_lo(first, dims.window, dims.b0, dims.b1), key_hi(last, dims.b0, dims.b1));
}

// K/V cache word i (wwords16(HD) a row) as its elements: .lo 0..4 and, with W_F16,
// .hi 4..8. A q8_0 pool (KV_Q8) holds 8 codes a word, two words a 16-byte load,
// block i / 4's f16 scale among the scales from u32 word dims.own2 on.
struct KvWord { lo: vec4<f32>, hi: vec4<f32> }

fn q8_word(codes: vec4<u32>, scales: vec4<u32>, i: u32) -> KvWord {
    let two = select(codes.xy, codes.zw, (i & 1u) == 1u);
    let sh = vec4<u32>(24u, 16u, 8u, 0u);
    let lo = (vec4<i32>(bitcast<i32>(two.x)) << sh) >> vec4<u32>(24u);
    let hi = (vec4<i32>(bitcast<i32>(two.y)) << sh) >> vec4<u32>(24u);
    let s = dims.own2 + i / 8u;
    let d = unpack2x16float(scales[s % 4u])[(i / 4u) % 2u];
    return KvWord(vec4<f32>(lo) * d, vec4<f32>(hi) * d);
}

fn k_word(i: u32) -> KvWord {
    if (KV_Q8) {
        return q8_word(kc[i / 2u], kc[(dims.own2 + i / 8u) / 4u], i);
    }
    let w = kc[i];
    return KvWord(wlo4(w), whi4(w));
}

fn v_word(i: u32) -> KvWord {
    if (KV_Q8) {
        return q8_word(vc[i / 2u], vc[(dims.own2 + i / 8u) / 4u], i);
    }
    let w = vc[i];
    return KvWord(wlo4(w), whi4(w));
}

// xa · w.lo + xb · w.hi (W_F16) per component, as wload.wgsl's wmul16.
fn kv_mul16(w: KvWord, xa: vec4<f32>, xb: vec4<f32>) -> vec4<f32> {
    if (W_F16) {
        return xa * w.lo + xb * w.hi;
    }
    return xa * w.lo;
}

// The KV head query head h reads (grouped-query attention).
fn kv_head(h: u32, heads: u32, kv_heads: u32) -> u32 {
    return h / (heads / kv_heads);
}
