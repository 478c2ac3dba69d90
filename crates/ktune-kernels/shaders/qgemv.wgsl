// Quantized GEMV y[n] = w[n,k] · x[k], w in ggml blocks (QFMT: any ggml block format)
// read directly and dequantized in registers (qblock.wgsl): the interface of
// qgemv_wg and qgemv_subgroup (`shader!(VARIANT, "qgemv.wgsl", ..)`). Needs
// k a whole number of blocks (qbe()).
//
// Bindings: x, the weight buffer twice (quants at 1, the scales region at 2), y,
// the uniform.

struct Dims { n: u32, k: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> ws: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

fn row_count() -> u32 {
    return dims.n;
}
