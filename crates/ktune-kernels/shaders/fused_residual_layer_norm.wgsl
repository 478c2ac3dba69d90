// Fused residual add + LayerNorm with bias: h = x + r, y = (h - mean) /
// sqrt(var + eps) * w + b (a SigLIP encoder layer's residual and the norm after
// it): the interface that turns the LayerNorm bodies norm_layer_wg.wgsl and
// norm_layer_subgroup.wgsl into the fused kernels (`shader!("norm_layer_wg.wgsl",
// "fused_residual_layer_norm.wgsl", "layer_write.wgsl", ..)`; the output pass is
// layer_write.wgsl): their first statistics pass writes h through ln_read. Every
// invocation rereads only the h it wrote itself, so no barrier orders h. Any dim;
// w and b are read as u32 words decoded by W_F16 (wload.wgsl).
// Requires: layer_write.wgsl.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> r: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> b: array<u32>;
@group(0) @binding(4) var<storage, read_write> h: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<uniform> dims: Dims;

fn wload(i: u32) -> f32 { return wpick(w[wword(i)], i); }
fn bload(i: u32) -> f32 { return wpick(b[wword(i)], i); }

// The statistics passes' reads of element i (row base included): the first
// writes h = x + r, later ones reread it. Every invocation rereads only the h it
// wrote itself.
fn ln_read(i: u32) -> f32 {
    let v = x[i] + r[i];
    h[i] = v;
    return v;
}
fn ln_reread(i: u32) -> f32 { return h[i]; }
