// Fused RMSNorm prologue + quantized GEMV (decode): y[n] = w[n,k] · (x * inv_rms * g'),
// w in ggml blocks (QFMT: any ggml block format) dequantized in registers (qblock.wgsl),
// g' = g or 1 + g (unit_offset, Gemma), inv_rms = 1 / sqrt(mean(x²) + eps): the
// interface of norm_gemv_q_wg and norm_gemv_q_subgroup (`shader!(VARIANT,
// "norm_gemv_q.wgsl", ..)`). Needs k a whole number of blocks (qbe()).
//
// Bindings: x, the gain (f32), the weight buffer twice (quants at 2, the scales
// region at 3), y, the uniform (its residual and act words read by
// norm_gemv_q_subgroup only, which binds the decode chain's buffers itself).

struct Dims { n: u32, k: u32, eps: f32, unit_offset: u32, residual: u32, act: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> g: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> wq: array<u32>;
@group(0) @binding(3) var<storage, read> ws: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> dims: Dims;

fn row_count() -> u32 {
    return dims.n;
}
