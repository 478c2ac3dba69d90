// GEMM y[m,n] = x[m,k] · w[n,k]ᵀ, the straightforward way: each invocation owns
// one column j of y (one row of w) and ROWS consecutive rows of y, and walks k
// once, reading each weight a single time for all ROWS rows. No workgroup memory,
// scalar loads, any shape (bounds checks on both edges). Weights as u32 words
// decoded by W_F16 (f32 bits or packed f16 pairs). Includes: wload.wgsl (W_F16).

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

@compute @workgroup_size(WG_X, WG_Y)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let col = gid.x;
    let row0 = gid.y * ROWS;
    if (col >= dims.n || row0 >= dims.m) {
        return;
    }
    let k = dims.k;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var c = 0u; c < k; c++) {
        let wv = wload(col * k + c);
        for (var r = 0u; r < ROWS; r++) {
            // rows past m repeat the last row; their results are not stored
            let row = min(row0 + r, dims.m - 1u);
            acc[r] += x[row * k + c] * wv;
        }
    }
    for (var r = 0u; r < ROWS; r++) {
        if (row0 + r < dims.m) {
            y[(row0 + r) * dims.n + col] = acc[r];
        }
    }
}
