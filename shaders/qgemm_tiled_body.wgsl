// The staging and main loop of qgemm_tiled / qgemm_tiled_f16 (see there), over
// their workgroup tiles xs, wt of TileV (vec4 of f32 or f16: stored converted, read
// back as vec4<f32>). Includes: qblock.wgsl (block decoding: qunits, qpos, qchunk,
// qdecode).

// Stages step `st` (chunks st·TILE_K/32 ..) of x and of the dequantized w into
// buffer `buf`: zeros past the edges and past the last chunk.
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
    for (var e = tid; e < TILE_M * kv; e += WGS) {
        let r = e / kv;
        let c = e % kv;
        let gc = c0 * 8u + c;
        var v = vec4<f32>(0.0);
        if (m0 + r < dims.m && gc < kx) {
            v = x[(m0 + r) * kx + gc];
        }
        xs[(xb + r) * ks + c] = TileV(v);
    }
    for (var s = 0u; s < cps; s++) {
        let b = c0 + s;
        if (b >= nch) {
            // past the last chunk (TILE_K = 64, an odd number of chunks): zeros
            for (var i = tid; i < TILE_N * 8u; i += WGS) {
                wt[(wb + i / 8u) * ks + s * 8u + i % 8u] = TileV(0.0);
            }
            continue;
        }
        let blk = b / cpb;
        let ch = qchunk(b % cpb);
        for (var i = tid; i < TILE_N * ch.y; i += WGS) {
            let r = i / ch.y;
            let u = ch.x + i % ch.y;
            var d = QWord(vec4<f32>(0.0), vec4<f32>(0.0));
            if (n0 + r < dims.n) {
                d = qdecode(((n0 + r) * bpr + blk) * qunits() + u);
            }
            // vec4 index of each half in the tile row
            let p = (qpos(u) % vec2<u32>(32u)) / 4u + s * 8u;
            if (ch.z != 1u) {
                wt[(wb + r) * ks + p.x] = TileV(d.lo);
            }
            if (ch.z != 0u) {
                wt[(wb + r) * ks + p.y] = TileV(d.hi);
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
