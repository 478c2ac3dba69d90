// What the paged batch kernels share (attention_paged_stream,
// attention_paged_rows): the batch's table and where a query row's sequence keeps
// its keys. `pages` holds per sequence (row of `dims.own` words, f32 whole
// numbers) q_len, kv_len and the pool block of each `page` positions; the pools
// are [blocks, kv_heads, page, HD]. The uniform block is attention_dims.wgsl's
// with the words meaning: tokens (query rows of the batch), kv_len = seqs,
// kv_cap = page (positions a block), own = the width of a table row.
// Requires: attention_dims.wgsl, attention.wgsl.

@group(0) @binding(5) var<storage, read> pages: array<f32>;

// The query row's sequence's table (its first block entry), set by `locate`.
var<private> table: u32;

// The sequence query row `r` belongs to: its table is kept for `cache_row`;
// returns the row's position and the KV length of its sequence.
fn locate(r: u32) -> vec2<u32> {
    let width = dims.own;
    var t0 = 0u;
    var s = 0u;
    loop {
        let ql = u32(pages[s * width]);
        if (r < t0 + ql || s + 1u >= dims.kv_len) {
            break;
        }
        t0 += ql;
        s += 1u;
    }
    table = s * width + 2u;
    let ql = u32(pages[s * width]);
    let kv = u32(pages[s * width + 1u]);
    return vec2<u32>(kv - ql + (r - t0), kv);
}

// The pool row of key j of KV head kh of the located sequence.
fn cache_row(kh: u32, j: u32) -> u32 {
    let page = dims.kv_cap;
    let b = u32(pages[table + j / page]);
    return (b * dims.kv_heads + kh) * page + j % page;
}
