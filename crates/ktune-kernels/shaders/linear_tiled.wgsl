// Linear with bias, y[m,n] = act(x[m,k] · w[n,k]ᵀ + b[n]), tiled in workgroup memory
// with register blocking: the body is gemm_tile.wgsl (its rules on k and the tiles),
// the epilogue adds the bias and, when GELU, applies GELU-tanh (act.wgsl) before
// the store. Also the second dispatch of patch_embed_im2col (the patch matrix as x,
// GELU off). Bias words decoded by W_F16 like the weights.
// Head: gemm_tiling.wgsl. Includes: gemm_tile.wgsl, reg_tile.wgsl, act.wgsl,
// wload.wgsl (W_F16, 16-byte words).
// Requires: gemm_tiling.wgsl, gemm_tile.wgsl, act.wgsl.

override GELU: bool = false;

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

fn gemm_store(row: u32, col: u32, v: f32) {
    let s = v + wpick(b[wword(col)], col);
    y[row * dims.n + col] = select(s, act(s, true), GELU);
}

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    gemm_tile(wid, tid);
}
