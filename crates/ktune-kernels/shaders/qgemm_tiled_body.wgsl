// The staging and main loop of qgemm_tiled / qgemm_tiled_f16 (see there), over
// their workgroup tiles xs, wt of TileV (vec4 of f32 or f16: stored converted, read
// back as vec4<f32>). Includes: qblock.wgsl (block decoding: qunits, qpos, qchunk,
// qdecode).

// Stages step `st` (chunks st·TILE_K/32 ..) of x and of the dequantized w into
// buffer `buf`: zeros past the edges and past the last chunk. Every loop has a
// constant trip count (an invocation's share, rounded up) and its loads no branch
// (an element past the edges loads element 0 and drops it), so the compiler can
// unroll a loop and have all its loads in flight before the first store.
fn stage(st: u32, buf: u32, tid: u32, m0: u32, n0: u32) {
    let ks = TILE_K / 4u + 1u;
    let kv = TILE_K / 4u;
    let cps = TILE_K / 32u;
    let c0 = st * cps;
    let bpr = dims.k / qbe();
    let cpb = qbe() / 32u;
    let nch = dims.k / 32u;
    let kx = dims.k / 4u;
    let xb = buf * TILE_M;
    let wb = buf * TILE_N;
    for (var t = 0u; t < (TILE_M * kv + WGS - 1u) / WGS; t++) {
        let e = tid + t * WGS;
        let r = e / kv;
        let c = e % kv;
        let gc = c0 * 8u + c;
        let ok = m0 + r < dims.m && gc < kx;
        let v = select(vec4<f32>(0.0), x[select(0u, (m0 + r) * kx + gc, ok)], ok);
        if (e < TILE_M * kv) {
            xs[(xb + r) * ks + c] = TileV(v);
        }
    }
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

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let ks = TILE_K / 4u + 1u; // padded tile row stride, in vec4
    let kv = TILE_K / 4u;      // vec4 per tile row
    let tnx = TILE_N / REG_N;  // invocations along n
    let tmy = TILE_M / REG_M;  // invocations along m
    let tx = tid % tnx;
    let ty = tid / tnx;
    let m0 = wid.y * TILE_M;
    let n0 = wid.x * TILE_N;
    let steps = (dims.k / 32u + TILE_K / 32u - 1u) / (TILE_K / 32u);
    var acc: array<f32, 64>;
    for (var i = 0u; i < REG_M * REG_N; i++) {
        acc[i] = 0.0;
    }
    var a: array<vec4<f32>, 8>;
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
        let xb = buf * TILE_M;
        let wb = buf * TILE_N;
        for (var c = 0u; c < kv; c++) {
            for (var i = 0u; i < REG_M; i++) {
                a[i] = vec4<f32>(xs[(xb + ty + i * tmy) * ks + c]);
            }
            for (var j = 0u; j < REG_N; j++) {
                let b = vec4<f32>(wt[(wb + tx + j * tnx) * ks + c]);
                for (var i = 0u; i < REG_M; i++) {
                    acc[i * REG_N + j] += dot(a[i], b);
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < REG_M; i++) {
        let row = m0 + ty + i * tmy;
        for (var j = 0u; j < REG_N; j++) {
            let col = n0 + tx + j * tnx;
            if (row < dims.m && col < dims.n) {
                y[row * dims.n + col] = acc[i * REG_N + j];
            }
        }
    }
}
