// GEMM y[m,n] = x[m,k] · w[n,k]ᵀ, tiled in workgroup memory with register blocking:
// the body is gemm_tile.wgsl (tiles, staging, register blocks; its rules on k and
// the tiles), the epilogue a plain store.
// Head: gemm_tiling.wgsl. Includes: gemm_tile.wgsl, reg_tile.wgsl, wload.wgsl
// (W_F16, 16-byte words).
// Requires: gemm_tiling.wgsl, gemm_tile.wgsl.

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

fn gemm_store(row: u32, col: u32, v: f32) {
    y[row * dims.n + col] = v;
}

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    gemm_tile(wid, tid);
}
