// LayerNorm y = (x - mean) / sqrt(var + eps) * w + b: the interface (ln_read,
// ln_reread) and the output pass of norm_layer_wg and norm_layer_subgroup
// (`shader!(VARIANT, "norm_layer.wgsl", ..)`), which compute the row statistics
// each their own way, after the head affine_head.wgsl (w, b, y, dims). Any dim;
// w and b are read as u32 words decoded by W_F16 (wload.wgsl).

struct Dims { rows: u32, dim: u32, eps: f32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;

// The statistics passes' reads of element i (row base included).
fn ln_read(i: u32) -> f32 { return x[i]; }
fn ln_reread(i: u32) -> f32 { return x[i]; }

fn row_count() -> u32 {
    return dims.rows;
}

// y = (x - mean) * rs * w + b over the invocation's strided share of the row.
fn layer_write(base: u32, first: u32, stride: u32, mean: f32, rs: f32) {
    for (var c = first; c < dims.dim; c += stride) {
        y[base + c] = (ln_reread(base + c) - mean) * rs * wload(c) + bload(c);
    }
}
