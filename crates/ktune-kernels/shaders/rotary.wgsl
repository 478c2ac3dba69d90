// Rotary position embedding pieces shared by rope_pair, rope_shared and the fused
// q/k norm + RoPE shaders (`shader!(FILE, .., "rotary.wgsl")`): their uniform block
// and pure functions.
//
// The angle pos * f is reduced to [-pi, pi] exactly enough for far positions: pos
// and f are split into 12-bit halves so the four partial products are exact in f32,
// each is reduced by 2pi in three parts (Cody-Waite), and only then do the
// hardware cos/sin run (accurate near zero only on many GPUs). Exact for positions
// below 500000 (checked on the host) and f <= 1 (inverse frequencies).

// Rows [tokens, heads, head_dim] at positions pos0 + token; rope's host passes the
// first six words (eps and unit_offset are the fused q/k norm's).
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

const INV_TAU: f32 = 0.15915494309189535;
const TAU_HI: f32 = 6.28125;                  // 8 significant bits: k * TAU_HI is exact
const TAU_MID: f32 = 0.0019353071693331003;   // f32(2pi - TAU_HI)
const TAU_LO: f32 = 1.0253131677018246e-11;   // 2pi - TAU_HI - TAU_MID

fn rope_reduce(t: f32) -> f32 {
    let k = round(t * INV_TAU);
    return ((t - k * TAU_HI) - k * TAU_MID) - k * TAU_LO;
}

// pos * f reduced to [-pi, pi].
fn rope_angle(pos: u32, f: f32) -> f32 {
    let fh = bitcast<f32>(bitcast<u32>(f) & 0xfffff000u);
    let fl = f - fh;
    let ph = f32(pos & 0xfffff000u);
    let pl = f32(pos & 0xfffu);
    return rope_reduce(rope_reduce(ph * fh) + rope_reduce(ph * fl) + rope_reduce(pl * fh) + rope_reduce(pl * fl));
}

// (cos, sin) of pos * f.
fn rope_cs(pos: u32, f: f32) -> vec2<f32> {
    let r = rope_angle(pos, f);
    return vec2<f32>(cos(r), sin(r));
}

// The two dims of rotary pair i: (i, i + half) (rotate half) or (2i, 2i + 1)
// (interleaved).
fn rope_dims(i: u32, half: u32, interleaved: bool) -> vec2<u32> {
    return select(vec2<u32>(i, i + half), vec2<u32>(2u * i, 2u * i + 1u), interleaved);
}

// The pair (x0, x1) rotated by the angle with cos and sin cs.
fn rope_rotate(x0: f32, x1: f32, cs: vec2<f32>) -> vec2<f32> {
    return vec2<f32>(x0 * cs.x - x1 * cs.y, x1 * cs.x + x0 * cs.y);
}
