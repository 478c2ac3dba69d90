// Head of the shaders that apply a weight and a bias to one input, y = f(in, w) + b
// (linear_simple, patch_embed_direct, norm_layer): the weight, bias, output and
// uniform bindings 1..4, and the weight and bias reads (`wload`, `bload`: element i,
// decoded by the shader's `override W_F16`, wload.wgsl). The input at binding 0 and
// the `Dims` struct are each shader's own.

@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

fn wload(i: u32) -> f32 { return wpick(w[wword(i)], i); }
fn bload(i: u32) -> f32 { return wpick(b[wword(i)], i); }
