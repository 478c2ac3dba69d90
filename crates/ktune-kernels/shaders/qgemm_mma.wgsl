// Quantized GEMM y[m,n] = x[m,k] · w[n,k]ᵀ, or with W_MATS = 2 the fused gate_up y[m,n]
// = act(x · w[0..n]ᵀ) · (x · w[n..2n]ᵀ), on MAT x MAT x MAT matrices: x and w in ggml
// blocks (QFMT), dequantized and staged as f16 in workgroup memory, f32 accumulation.
// Heads: coop8.wgsl or coop16.wgsl (cooperative matrices, entry point mma_coop.wgsl)
// or coop_emu.wgsl (the same tiling in plain loops, entry point mma_emu.wgsl), then
// mma_tiling.wgsl. Tiles and output mma.wgsl, weight staging mma_q.wgsl (block
// decoding: qblock.wgsl), the activation act.wgsl. Needs k a whole number of blocks
// (qbe()); any m and n.
// Requires: mma_tiling.wgsl, mma.wgsl, mma_q.wgsl.

override QFMT: u32 = 0u;

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> ws: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;
