// The column GEMM body y[m,n] = x[m,k] · w[n,k]ᵀ shared by gemm_simple and the
// vision family's linear_simple / patch_embed_direct (`shader!(FILE,
// "gemm_col.wgsl", "wload.wgsl", ..)`): each invocation owns one column j of y (one
// row of w) and ROWS consecutive rows of y, and walks k once, reading each weight
// a single time for all ROWS rows. No workgroup memory, scalar loads, any shape
// (bounds checks on both edges). The including shader declares the overrides
// WG_X, WG_Y, ROWS (<= 4), W_F16, `dims` with m, n, k, and supplies
// `xload(row, c)` (element c of row `row` of x: a matrix, or a patch gathered
// from an image), `wload(i)` and `gemm_store(row, col, value)` (the epilogue).
// Includes: wload.wgsl.

fn gemm_col(gid: vec3<u32>) {
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
            acc[r] += xload(row, c) * wv;
        }
    }
    for (var r = 0u; r < ROWS; r++) {
        if (row0 + r < dims.m) {
            gemm_store(row0 + r, col, acc[r]);
        }
    }
}
