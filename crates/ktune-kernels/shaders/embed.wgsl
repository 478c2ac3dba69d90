// The token embedding on the GPU: the row of the token id in position.wgsl's
// `token` word, read from the embedding table as the GPU stores it (f32, packed
// f16 pairs, or a block format decoded by qblock.wgsl), times the model's
// embedding scale, into the hidden state `out[hidden]`. A table split in blocks
// (an LM head cut to fit the binding size) runs one program per block. One invocation per
// element (f32, f16) or per block unit (quantized: qblock.wgsl's units cover
// each element of a block once). The runtime (runtime::gpu) records it before a
// decode step, so a decode token writes the position uniform only.
// Requires: grid.wgsl, position.wgsl, qblock.wgsl, qgeom.wgsl.

override WG: u32 = 256;
override QFMT: u32 = 0u;
override F16: bool = false;

struct Embed {
    hidden: u32,
    scale: f32,
    start: u32,  // the table block's first vocabulary row (an LM head split in blocks)
    rows: u32,   // its rows
}

// The token's row in this table block, or NONE when another block holds it
// (each block's program runs; the one holding the token writes the row).
const NONE: u32 = 0xffffffffu;

fn block_row(e: Embed) -> u32 {
    let t = position.token;
    if (t < e.start || t - e.start >= e.rows) {
        return NONE;
    }
    return t - e.start;
}

@group(0) @binding(0) var<storage, read> wq: array<u32>;
@group(0) @binding(1) var<storage, read> ws: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> emb: Embed;
// qblock.wgsl's qdot reads the including shader's `x` (unused here).
@group(0) @binding(4) var<storage, read> x: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn embed_q(g: Grid) {
    let i = invocation(g);
    let per_row = emb.hidden / qbe() * qunits();
    let row = block_row(emb);
    if (i >= per_row || row == NONE) {
        return;
    }
    let j = i % qunits();
    let base = (i / qunits()) * qbe();
    let p = qpos(j);
    let d = qdecode(row * per_row + i);
    for (var k = 0u; k < 4u; k++) {
        out[base + p.x + k] = d.lo[k] * emb.scale;
        if (QFMT != 0u) {
            out[base + p.y + k] = d.hi[k] * emb.scale;
        }
    }
}

// f32 (F16 false) or packed f16 pairs (F16 true), one element an invocation.
@group(0) @binding(0) var<storage, read> table: array<u32>;
@group(0) @binding(1) var<storage, read_write> out_f: array<f32>;
@group(0) @binding(2) var<uniform> emb_f: Embed;

@compute @workgroup_size(WG)
fn embed_f(g: Grid) {
    let i = invocation(g);
    let row = block_row(emb_f);
    if (i < emb_f.hidden && row != NONE) {
        let e = row * emb_f.hidden + i;
        var v: f32;
        if (F16) {
            let p = unpack2x16float(table[e >> 1u]);
            v = select(p.x, p.y, (e & 1u) == 1u);
        } else {
            v = bitcast<f32>(table[e]);
        }
        out_f[i] = v * emb_f.scale;
    }
}
