// Fused Q/K/V projection of one token: one matrix-vector product over the
// concatenated weight w[nq + 2 nkv, k], optional bias, rows routed to q, k_out and
// v_out. Each workgroup owns ROWS consecutive rows; every invocation accumulates a
// partial sum for each of them from one load of x, striding over k by WG, and the
// workgroup reduces them through workgroup memory. Any k; weights as u32 words
// decoded by W_F16.
//
// Head: qkv_head.wgsl (the bias and output bindings 2..6). Includes: block_wg.wgsl
// (entry point), reduce_wg.wgsl (the tree), qkv_store.wgsl (the routing, Dims),
// wload.wgsl.
// Requires: qkv_head.wgsl, qkv_store.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 2;
override W_F16: bool = false;

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;

var<workgroup> partial: array<f32, WG * ROWS>;

fn wload(i: u32) -> f32 { return wpick(w[wword(i)], i); }

fn block_partials(row0: u32, tid: u32) -> u32 {
    let k = dims.k;
    let n = row_count();
    var acc: array<f32, 8>; // ROWS <= 8 (checked on the host)
    for (var r = 0u; r < ROWS; r++) { acc[r] = 0.0; }
    for (var c = tid; c < k; c += WG) {
        let xv = x[c];
        for (var r = 0u; r < ROWS; r++) {
            let row = min(row0 + r, n - 1u);
            acc[r] += xv * wload(row * k + c);
        }
    }
    for (var r = 0u; r < ROWS; r++) { partial[r * WG + tid] = acc[r]; }
    return ROWS;
}

fn block_store(row: u32, r: u32) {
    qkv_store(row, partial[r * WG]);
}
