// Linear with bias, y[m,n] = act(x[m,k] · w[n,k]ᵀ + b[n]), the straightforward way:
// the body is gemm_col.wgsl (one column and ROWS rows of y per invocation, scalar
// loads, any shape), the epilogue adds the bias and, when GELU, applies GELU-tanh
// (act.wgsl). Weights and bias as u32 words decoded by W_F16.
// Head: affine_head.wgsl (w, b, y, dims). Includes: gemm_col.wgsl, act.wgsl,
// wload.wgsl (W_F16).

override WG_X: u32 = 16;
override WG_Y: u32 = 4;
override ROWS: u32 = 1; // <= 4 (the host offers 1, 2, 4)
override W_F16: bool = false;
override GELU: bool = false;

struct Dims { m: u32, n: u32, k: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;

fn xload(row: u32, c: u32) -> f32 { return x[row * dims.k + c]; }

fn gemm_store(row: u32, col: u32, v: f32) {
    let s = v + bload(col);
    y[row * dims.n + col] = select(s, act(s, true), GELU);
}

@compute @workgroup_size(WG_X, WG_Y)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    gemm_col(gid);
}
