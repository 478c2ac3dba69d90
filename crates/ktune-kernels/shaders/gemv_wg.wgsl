// GEMV y[n] = w[n,k] · x[k] with a workgroup-memory tree reduction.
// Each workgroup owns ROWS consecutive rows; every invocation accumulates a partial
// sum for each of them in registers (x read once for all ROWS rows; rows past n
// recompute the last row, never stored), striding over k by WG, then leaves them
// in workgroup memory once and the workgroup reduces WG partials per row. Any k; weights as u32 words decoded by
// W_F16 (f32 bits or packed f16 pairs). Includes: block_wg.wgsl (entry point),
// reduce_wg.wgsl (the tree), wload.wgsl (W_F16).

override WG: u32 = 128;
override ROWS: u32 = 2;
override W_F16: bool = false;

struct Dims { n: u32, k: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

var<workgroup> partial: array<f32, WG * ROWS>;

fn wload(i: u32) -> f32 { return wpick(w[wword(i)], i); }

fn row_count() -> u32 {
    return dims.n;
}

fn block_partials(row0: u32, tid: u32) -> u32 {
    let k = dims.k;
    let last = dims.n - 1u;
    var acc: array<f32, 8>;
    for (var c = tid; c < k; c += WG) {
        let xv = x[c];
        for (var r = 0u; r < ROWS; r++) {
            acc[r] += xv * wload(min(row0 + r, last) * k + c);
        }
    }
    for (var r = 0u; r < ROWS; r++) {
        partial[r * WG + tid] = acc[r];
    }
    return ROWS;
}

fn block_store(row: u32, r: u32) {
    y[row] = partial[r * WG];
}
