// Patch embedding (the conv with kernel = stride = patch) as a direct conv: the
// body is gemm_col.wgsl over patches x features (one feature and ROWS patches per
// invocation, each weight read once for the ROWS patches) whose x element
// (patch p, c) is read straight from the image, c = (channel, ky, kx) in the conv
// weight's flattening: no patch matrix. Bias added in the epilogue. Weights and
// bias as u32 words decoded by W_F16.
// Head: affine_head.wgsl (w, b, y, dims). Includes: gemm_col.wgsl, wload.wgsl
// (W_F16).

override WG_X: u32 = 16;
override WG_Y: u32 = 4;
override ROWS: u32 = 1; // <= 4 (the host offers 1, 2, 4)
override W_F16: bool = false;

// m = patches, n = hidden, k = channels * patch * patch; side = image / patch
struct Dims { m: u32, n: u32, k: u32, image: u32, psize: u32, side: u32 }

@group(0) @binding(0) var<storage, read> pixels: array<f32>;

fn xload(p: u32, c: u32) -> f32 {
    let pp = dims.psize * dims.psize;
    let ch = c / pp;
    let r = c % pp;
    let yy = (p / dims.side) * dims.psize + r / dims.psize;
    let xx = (p % dims.side) * dims.psize + r % dims.psize;
    return pixels[(ch * dims.image + yy) * dims.image + xx];
}

fn gemm_store(row: u32, col: u32, v: f32) {
    y[row * dims.n + col] = v + bload(col);
}

@compute @workgroup_size(WG_X, WG_Y)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    gemm_col(gid);
}
