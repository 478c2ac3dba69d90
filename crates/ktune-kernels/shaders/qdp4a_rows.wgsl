// The uniform block, outputs and split partials of the second-generation quantized
// projections over n output rows (qdp4a_gemv.wgsl, qdp4a_gate_up.wgsl): dims.n
// rows of y from weights of k columns; dims.act (gate_up: 0 silu, 1 gelu_tanh; the
// GEMV's host passes none, a zero word); with SPLIT > 1 the partials in `part`.

struct Dims { n: u32, k: u32, act: u32 }

@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;
@group(0) @binding(7) var<storage, read_write> part: array<f32>;

fn dq_nrows() -> u32 {
    return dims.n;
}
