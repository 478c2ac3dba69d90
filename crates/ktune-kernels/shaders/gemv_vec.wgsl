// GEMV y[n] = w[n,k] · x[k] with 16-byte vector loads and a workgroup reduction.
// Needs k % 4 == 0 (f32 weights) or k % 8 == 0 (f16 weights): each load is one
// vec4<u32>, i.e. 4 f32 weights or 8 packed f16 weights. Each workgroup owns ROWS
// rows; partial sums are kept in registers and reduced through workgroup memory.
// Includes: gemv16.wgsl (bindings), block_wg.wgsl (entry point), reduce_wg.wgsl (the tree), wload.wgsl
// (W_F16, 16-byte words).

override WG: u32 = 128;
override ROWS: u32 = 2;
override W_F16: bool = false;

var<workgroup> partial: array<f32, WG * ROWS>;

fn block_partials(row0: u32, tid: u32) -> u32 {
    let words = wwords16(dims.k);
    var acc: array<f32, 8>; // ROWS <= 8 (checked on the host)
    for (var r = 0u; r < ROWS; r++) { acc[r] = 0.0; }
    for (var c = tid; c < words; c += WG) {
        let xi = wx16(c);
        let xa = x[xi.x];
        let xb = x[xi.y];
        for (var r = 0u; r < ROWS; r++) {
            let row = min(row0 + r, dims.n - 1u);
            acc[r] += wdot16(w[row * words + c], xa, xb);
        }
    }
    for (var r = 0u; r < ROWS; r++) { partial[r * WG + tid] = acc[r]; }
    return ROWS;
}

fn block_store(row: u32, r: u32) {
    y[row] = partial[r * WG];
}
