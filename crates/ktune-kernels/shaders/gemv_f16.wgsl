// GEMV with native f16 weight storage (`enable f16`, needs SHADER_F16): weights
// read as vec4<f16>, widened and accumulated in f32, workgroup reduction.
// Needs k % 4 == 0. Includes: block_wg.wgsl (entry point), reduce_wg.wgsl (the tree).
enable f16;

override WG: u32 = 128;
override ROWS: u32 = 2;

struct Dims { n: u32, k: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

var<workgroup> partial: array<f32, WG * ROWS>;

fn row_count() -> u32 {
    return dims.n;
}

fn block_partials(row0: u32, tid: u32) -> u32 {
    let vecs = dims.k / 4u;
    var acc: array<f32, 8>; // ROWS <= 8 (checked on the host)
    for (var r = 0u; r < ROWS; r++) { acc[r] = 0.0; }
    for (var c = tid; c < vecs; c += WG) {
        let xv = x[c];
        for (var r = 0u; r < ROWS; r++) {
            let row = min(row0 + r, dims.n - 1u);
            acc[r] += dot(xv, vec4<f32>(w[row * vecs + c]));
        }
    }
    for (var r = 0u; r < ROWS; r++) { partial[r * WG + tid] = acc[r]; }
    return ROWS;
}

fn block_store(row: u32, r: u32) {
    y[row] = partial[r * WG];
}
