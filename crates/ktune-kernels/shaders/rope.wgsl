// Rotary position embedding of q or k rows [tokens, heads, head_dim] at positions
// pos0 + token: the interface of rope_pair and rope_shared (`shader!(VARIANT,
// "rope.wgsl", ..)`). Dims 0 .. rot_dim rotate in rot_dim / 2 pairs, (i, i + rot/2)
// (rotate half) or (2i, 2i + 1) (interleaved), by pos * inv_freq[i] (rotary.wgsl);
// the dims after them are copied. The uniform block is rotary.wgsl's Dims; a
// row's position is position.wgsl's `row_position`, not the block's pos0.
// Requires: rotary.wgsl, position.wgsl.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> inv_freq: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;
