// Quantized GEMV y[n] = w[n,k] · x[k], w in ggml blocks (any ggml block format by the
// QFMT override) read directly and dequantized in registers. Each workgroup owns
// ROWS consecutive rows; every invocation takes quant words (4 or 8 weights each)
// strided by WG, for all ROWS rows from the same x loads, into register
// accumulators (rows past n recompute the last row, never stored), then the
// workgroup reduces WG partials per row through workgroup memory once. Needs k a whole number of blocks (qbe()).
// Includes: qgemv.wgsl (interface), qblock.wgsl (block decoding), qrows_wg.wgsl
// (the partials), block_wg.wgsl (entry point), reduce_wg.wgsl (the tree).

override WG: u32 = 128;
override ROWS: u32 = 2;
override QFMT: u32 = 0u;

var<workgroup> partial: array<f32, WG * ROWS>;

fn block_store(row: u32, r: u32) {
    y[row] = partial[r * WG];
}
