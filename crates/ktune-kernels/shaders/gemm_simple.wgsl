// GEMM y[m,n] = x[m,k] · w[n,k]ᵀ, the straightforward way: the body is
// gemm_col.wgsl (one column and ROWS rows of y per invocation, scalar loads, any
// shape), x read as a row-major matrix, the epilogue a plain store. Weights as u32
// words decoded by W_F16 (f32 bits or packed f16 pairs).
// Includes: gemm_col.wgsl, wload.wgsl (W_F16).

override WG_X: u32 = 16;
override WG_Y: u32 = 4;
override ROWS: u32 = 1; // <= 4 (the host offers 1, 2, 4)
override W_F16: bool = false;

struct Dims { m: u32, n: u32, k: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

fn wload(i: u32) -> f32 { return wpick(w[wword(i)], i); }

fn xload(row: u32, c: u32) -> f32 { return x[row * dims.k + c]; }

fn gemm_store(row: u32, col: u32, v: f32) {
    y[row * dims.n + col] = v;
}

@compute @workgroup_size(WG_X, WG_Y)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    gemm_col(gid);
}
