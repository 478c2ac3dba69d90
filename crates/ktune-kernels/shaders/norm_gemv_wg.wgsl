// Fused RMSNorm prologue + GEMV (decode): y[n] = w[n,k] · (x * inv_rms * g'), with
// g' = g, or 1 + g when unit_offset (Gemma), and inv_rms = 1 / sqrt(mean(x²) + eps).
// Since y_r = inv_rms · Σ_c w[r,c]·x[c]·g'[c], the normalized vector is never
// stored and w is read once: each workgroup owns ROWS consecutive rows; every
// invocation strides over k by WG, accumulating x[c]·g'[c]·w[r,c] for each row in
// registers and x[c]² alongside (x and g read once for all ROWS rows); one
// workgroup tree reduction then sums the ROWS + 1 partials and the epilogue scales
// the row sums by inv_rms. Any k; the gain and the weights are u32 words decoded by
// W_F16 (f32 bits or packed f16 pairs). Includes: norm_block_wg.wgsl (partials and
// store), block_wg.wgsl (entry point), reduce_wg.wgsl (the tree), wload.wgsl (W_F16).
// Requires: norm_block_wg.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 2;
override W_F16: bool = false;

struct Dims { n: u32, k: u32, eps: f32, unit_offset: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> g: array<u32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

// Rows 0..ROWS: the partial dot products; row ROWS: the partial sums of squares.
var<workgroup> partial: array<f32, WG * (ROWS + 1u)>;

fn gload(i: u32) -> f32 { return wpick(g[wword(i)], i); }
fn wload(i: u32) -> f32 { return wpick(w[wword(i)], i); }

fn row_count() -> u32 {
    return dims.n;
}

fn block_partials(row0: u32, tid: u32) -> u32 {
    let k = dims.k;
    let off = select(0.0, 1.0, dims.unit_offset != 0u);
    var acc: array<f32, 8>; // ROWS <= 8 (the parameter's values)
    for (var r = 0u; r < ROWS; r++) {
        acc[r] = 0.0;
    }
    var ss = 0.0;
    for (var c = tid; c < k; c += WG) {
        let xv = x[c];
        ss += xv * xv;
        let xg = xv * (gload(c) + off);
        for (var r = 0u; r < ROWS; r++) {
            let row = row0 + r;
            if (row < dims.n) {
                acc[r] += xg * wload(row * k + c);
            }
        }
    }
    return norm_partials(acc, ss, tid);
}
