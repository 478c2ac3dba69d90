// GEMM y[m,n] = x[m,k] · w[n,k]ᵀ, tiled in workgroup memory with register blocking:
// the body is gemm_tile.wgsl (tiles, staging, register blocks; its rules on k and
// the tiles), the epilogue a plain store.
// Includes: gemm_tile.wgsl, wload.wgsl (W_F16, 16-byte words).

override TILE_M: u32 = 64;
override TILE_N: u32 = 64;
override TILE_K: u32 = 16;
override REG_M: u32 = 4;
override REG_N: u32 = 4;
override WGS: u32 = 256; // (TILE_M / REG_M) * (TILE_N / REG_N), set by the host
override W_F16: bool = false;

struct Dims { m: u32, n: u32, k: u32 }

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
