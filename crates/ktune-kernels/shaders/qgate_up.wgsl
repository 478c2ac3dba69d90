// Quantized fused gate+up y[t, j] = act(x[t]·w[j]) * (x[t]·w[n + j]), w[2n, k] in
// ggml blocks read directly and dequantized in registers (qblock.wgsl): the
// interface of qgate_up_wg and qgate_up_subgroup (`shader!(VARIANT,
// "qgate_up.wgsl", ..)`). Needs k a whole number of blocks (qbe()).
//
// Bindings: x, the weight buffer twice (quants at 1, the scales region at 2), y,
// the uniform.

struct Dims { rows: u32, n: u32, k: u32, act: u32 } // act: 0 silu, 1 gelu_tanh

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> ws: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;
