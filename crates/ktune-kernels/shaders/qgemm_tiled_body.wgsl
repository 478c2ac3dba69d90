// The staging and main loop of qgemm_tiled / qgemm_tiled_f16 (see there), over
// their workgroup tiles xs, wt of TileV (vec4 of f32 or f16: stored converted, read
// back as vec4<f32>). Includes: qblock.wgsl (block decoding: qunits, qpos, qchunk,
// qdecode), reg_tile.wgsl (the x staging, the register block, the stores).
// Requires: reg_tile.wgsl.

// Stages step `st` (chunks st·TILE_K/32 ..) of x and of the dequantized w into
// buffer `buf`: zeros past the edges and past the last chunk. Every loop has a
// constant trip count (an invocation's share, rounded up) and its loads no branch
// (an element past the edges loads element 0 and drops it), so the compiler can
// unroll a loop and have all its loads in flight before the first store.
fn stage(st: u32, buf: u32, tid: u32, m0: u32, n0: u32) {
    let ks = TILE_K / 4u + 1u;
    let cps = TILE_K / 32u;
    let c0 = st * cps;
    let bpr = dims.k / qbe();
    let cpb = qbe() / 32u;
    let nch = dims.k / 32u;
    let wb = buf * TILE_N;
    stage_x(buf * TILE_M, m0, c0 * 8u, tid);
    let cy = qchunk(0u).y; // units per chunk: the same for every chunk of a format
    for (var s = 0u; s < cps; s++) {
        let b = c0 + s;
        let blk = b / cpb;
        let ch = qchunk(b % cpb);
        for (var t = 0u; t < (TILE_N * cy + WGS - 1u) / WGS; t++) {
            let i = tid + t * WGS;
            let r = i / cy;
            let u = ch.x + i % cy;
            // past the last chunk (TILE_K = 64, an odd number of chunks) or the
            // last row: zeros, from the units that would hold the chunk
            let ok = b < nch && n0 + r < dims.n;
            let d = qdecode(select(0u, ((n0 + r) * bpr + blk) * qunits() + u, ok));
            let lo = select(vec4<f32>(0.0), d.lo, ok);
            let hi = select(vec4<f32>(0.0), d.hi, ok);
            // vec4 index of each half in the tile row
            let p = (qpos(u) % vec2<u32>(32u)) / 4u + s * 8u;
            if (i < TILE_N * cy) {
                if (ch.z != 1u) {
                    wt[(wb + r) * ks + p.x] = TileV(lo);
                }
                if (ch.z != 0u) {
                    wt[(wb + r) * ks + p.y] = TileV(hi);
                }
            }
        }
    }
}

// y[row, col] = value: the register tile's epilogue.
fn gemm_store(row: u32, col: u32, v: f32) {
    y[row * dims.n + col] = v;
}

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let m0 = wid.y * TILE_M;
    let n0 = wid.x * TILE_N;
    let steps = (dims.k / 32u + TILE_K / 32u - 1u) / (TILE_K / 32u);
    var acc: array<f32, 64>;
    for (var i = 0u; i < REG_M * REG_N; i++) {
        acc[i] = 0.0;
    }
    if (DOUBLE_BUF == 1u && steps > 0u) {
        stage(0u, 0u, tid, m0, n0);
        workgroupBarrier();
    }
    for (var st = 0u; st < steps; st++) {
        var buf = 0u;
        if (DOUBLE_BUF == 1u) {
            // the next step goes into the other buffer while this one is read; its
            // last reads were before the previous step's barrier
            buf = st % 2u;
            if (st + 1u < steps) {
                stage(st + 1u, 1u - buf, tid, m0, n0);
            }
        } else {
            stage(st, 0u, tid, m0, n0);
            workgroupBarrier();
        }
        reg_tile_step(&acc, buf * TILE_M, buf * TILE_N, tid);
        workgroupBarrier();
    }
    reg_tile_store(&acc, m0, n0, tid);
}
