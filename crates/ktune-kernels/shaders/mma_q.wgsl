// The weight staging of the matrix-tile GEMMs over ggml blocks (mma.wgsl): w bound
// as quants and scales (wq, ws; qblock.wgsl decodes), dequantized and rounded to f16
// into wt. k is a whole number of blocks (qbe()), so of 32-element chunks.
// Requires: mma.wgsl, qblock.wgsl, qgeom.wgsl.
//
// A slot is one unit of a block (qdecode: 4 or 8 values) inside a 32-element chunk,
// held as 8 packed halves: slot f of a step is matrix g, chunk s of the step, unit
// tid + t·WGS of the chunk's tile_n() x w_units() units (row, unit), with f = (g ·
// chunks per step + s) · w_per() + t.

// 32-element chunks along k.
fn nchunks() -> u32 {
    return dims.k / 32u;
}

// Units of a block that cover one 32-element chunk (qchunk(..).y: the same for
// every chunk of a format), and slots per invocation for one matrix and chunk.
fn w_units() -> u32 {
    return qchunk(0u).y;
}

fn w_per() -> u32 {
    return (tile_n() * w_units() + WGS - 1u) / WGS;
}

fn w_slots() -> u32 {
    return W_MATS * kstep() * w_per();
}

// Slot f's matrix g, chunk b (c0 + s) and item i (row i / w_units(), unit i %
// w_units() of the chunk's units).
fn w_slot(c0: u32, tid: u32, f: u32) -> vec4<u32> {
    let per = w_per();
    return vec4<u32>(f / (kstep() * per), c0 + (f / per) % kstep(), tid + (f % per) * WGS, (f / per) % kstep());
}

// Slot f of the step from chunk c0, dequantized (zeros past the edges and past the
// last chunk), as 8 packed halves (.lo, then .hi).
fn fetch_w(c0: u32, tid: u32, n0: u32, f: u32) -> vec4<u32> {
    let sl = w_slot(c0, tid, f);
    let cy = w_units();
    let r = sl.z / cy;
    let cpb = qbe() / 32u;
    let u = qchunk(sl.y % cpb).x + sl.z % cy;
    // no branch (see fetch_x): a slot past the edges decodes unit 0 and drops it
    let ok = sl.z < tile_n() * cy && sl.y < nchunks() && n0 + r < dims.n;
    let d = qdecode(select(0u, ((sl.x * dims.n + n0 + r) * (dims.k / qbe()) + sl.y / cpb) * qunits() + u, ok));
    let v = vec4<u32>(pack2x16float(d.lo.xy), pack2x16float(d.lo.zw), pack2x16float(d.hi.xy), pack2x16float(d.hi.zw));
    return select(vec4<u32>(0u), v, ok);
}

// Stores slot f (fetched for chunk c0) into tile buffer buf: the unit's halves that
// fall in its chunk, at their elements' places in its row.
fn store_w(c0: u32, buf: u32, tid: u32, f: u32, v: vec4<u32>) {
    let sl = w_slot(c0, tid, f);
    let cy = w_units();
    if (sl.z < tile_n() * cy) {
        let ch = qchunk(sl.y % (qbe() / 32u));
        let row = buf * wbuf() + (sl.x * tile_n() + sl.z / cy) * xstride() + sl.w * 32u;
        let p = qpos(ch.x + sl.z % cy) % vec2<u32>(32u) + vec2<u32>(row);
        let lo = vec4<f16>(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)));
        let hi = vec4<f16>(vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w)));
        for (var e = 0u; e < 4u; e++) {
            if (ch.z != 1u) {
                wt[p.x + e] = lo[e];
            }
            if (ch.z != 0u) {
                wt[p.y + e] = hi[e];
            }
        }
    }
}
