// LayerNorm y = (x - mean) / sqrt(var + eps) * w + b: the interface (ln_read,
// ln_reread) of norm_layer_wg and norm_layer_subgroup (`shader!(VARIANT,
// "norm_layer.wgsl", "layer_write.wgsl", ..)`), which compute the row statistics
// each their own way, after the head affine_head.wgsl (w, b, y, dims); the output
// pass is layer_write.wgsl. Any dim; w and b are read as u32 words decoded by
// W_F16 (wload.wgsl).
// Requires: affine_head.wgsl, layer_write.wgsl.

@group(0) @binding(0) var<storage, read> x: array<f32>;

// The statistics passes' reads of element i (row base included).
fn ln_read(i: u32) -> f32 { return x[i]; }
fn ln_reread(i: u32) -> f32 { return x[i]; }
