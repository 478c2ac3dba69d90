// The output pass of the LayerNorms, shared by their interfaces norm_layer.wgsl
// and fused_residual_layer_norm.wgsl (`shader!(VARIANT, INTERFACE,
// "layer_write.wgsl", ..)`): the uniform block, the rows for the entry point
// (row_wg.wgsl, row_sg.wgsl) and y = (v - mean) * rs * w + b, v the interface's
// `ln_reread`. Uses the interface's `y`, `dims`, `wload` and `bload` (w and b
// decoded by W_F16, wload.wgsl).

struct Dims { rows: u32, dim: u32, eps: f32 }

fn row_count() -> u32 {
    return dims.rows;
}

// y = (v - mean) * rs * w + b over the invocation's strided share of the row.
fn layer_write(base: u32, first: u32, stride: u32, mean: f32, rs: f32) {
    for (var c = first; c < dims.dim; c += stride) {
        y[base + c] = (ln_reread(base + c) - mean) * rs * wload(c) + bload(c);
    }
}
