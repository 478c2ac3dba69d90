// Paged batch attention, one workgroup per (query row, head) streaming the keys of
// the row's sequence block by block (attention_stream.wgsl's stream_row through
// attention_paged.wgsl's cache_row). Decode tokens and prefill chunks of many
// sequences in one dispatch; a row at position pos sees keys [first_key, pos].
// Heads: attention_decode_head.wgsl (WG, HD), attention_dims.wgsl (W_F16, Dims).
// Requires: attention_decode_head.wgsl, attention_dims.wgsl, attention_paged.wgsl, attention_stream.wgsl, attention.wgsl, grid.wgsl, reduce_wg.wgsl.

override KPT: u32 = 2;

@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(g: Grid) {
    let n = wg_linear(g.wid, g.nwg);
    if (n >= dims.tokens * dims.heads) {
        return;
    }
    let h = n % dims.heads;
    let at = locate(n / dims.heads);
    stream_row(n, kv_head(h, dims.heads, dims.kv_heads), first_key(at.x, dims.window), at.x + 1u, g.lid);
}
