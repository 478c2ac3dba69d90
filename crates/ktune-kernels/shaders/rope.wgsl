// Rotary position embedding of q or k rows [tokens, heads, head_dim] at positions
// pos0 + token: the interface of rope_pair and rope_shared (`shader!(VARIANT,
// "rope.wgsl", ..)`). Dims 0 .. rot_dim rotate in rot_dim / 2 pairs, (i, i + rot/2)
// (rotate half) or (2i, 2i + 1) (interleaved), by pos * inv_freq[i] (rotary.wgsl);
// the dims after them are copied.

struct Dims {
    tokens: u32,
    heads: u32,
    head_dim: u32,
    rot_half: u32,
    pos0: u32,
    interleaved: u32, // 0 rotate half, 1 interleaved
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> inv_freq: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;
