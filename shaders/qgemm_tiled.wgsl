// Quantized tiled GEMM y[m,n] = x[m,k] · w[n,k]ᵀ with w in ggml blocks (QFMT, any
// format of qblock.wgsl). Each workgroup computes a TILE_M x TILE_N tile of y; per
// step it stages TILE_K (32 or 64: whole 32-element block chunks) of x and of w in
// workgroup memory, the weights dequantized on the way in (each invocation decodes
// whole quant words), and every invocation accumulates a REG_M x REG_N register
// block from vec4 dot products. Its rows and columns are strided by the thread grid
// (row ty + i·TILE_M/REG_M, column tx + j·TILE_N/REG_N), so neighbouring invocations
// read neighbouring tile rows and write neighbouring columns of y.
//
// Tiles are vec4 rows of TILE_K / 4 + 1 vec4 (one vec4 of padding). TILE_K / 4 is 8
// or 16, so the row stride is odd in 16-byte units: the 8 invocations of a quarter
// wave that read 8 different w rows (one 128-bit load each) hit 8 different groups
// of 4 banks, and the x rows a wave reads (two or four different ty) do too.
//
// With DOUBLE_BUF = 1 the tiles are held twice: step st + 1 is staged into one
// buffer while step st is read from the other, and a single barrier per step
// separates them (a buffer's last reads come before the barrier that precedes its
// next staging).
//
// Needs k a whole number of blocks (qbe()); any m and n. Bindings: x, the weight
// buffer twice (quants at 1, the scales region at 2), y, the uniform.

override TILE_M: u32 = 32;
override TILE_N: u32 = 64;
override TILE_K: u32 = 32;
override REG_M: u32 = 4;
override REG_N: u32 = 4;
override QFMT: u32 = 0u;
// Invocations: (TILE_M / REG_M) * (TILE_N / REG_N), set by the host.
override WGS: u32 = 128;
// 1: two tile buffers, the next step staged while this one is read, one barrier
// per step (0: one buffer, two barriers per step).
override DOUBLE_BUF: u32 = 0u;

struct Dims { m: u32, n: u32, k: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> ws: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

// Buffer b (0, or 1 with DOUBLE_BUF), row r of a tile, vec4 c along k, at
// (b * rows + r) * (TILE_K / 4 + 1) + c.
var<workgroup> xs: array<vec4<f32>, (1u + DOUBLE_BUF) * TILE_M * (TILE_K / 4u + 1u)>;
var<workgroup> wt: array<vec4<f32>, (1u + DOUBLE_BUF) * TILE_N * (TILE_K / 4u + 1u)>;

// Includes: qblock.wgsl (block decoding: qunits, qpos, qchunk, qdecode).

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
        xs[(xb + r) * ks + c] = v;
    }
    for (var s = 0u; s < cps; s++) {
        let b = c0 + s;
        if (b >= nch) {
            // past the last chunk (TILE_K = 64, an odd number of chunks): zeros
            for (var i = tid; i < TILE_N * 8u; i += WGS) {
                wt[(wb + i / 8u) * ks + s * 8u + i % 8u] = vec4<f32>(0.0);
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
                wt[(wb + r) * ks + p.x] = d.lo;
            }
            if (ch.z != 0u) {
                wt[(wb + r) * ks + p.y] = d.hi;
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
                a[i] = xs[(xb + ty + i * tmy) * ks + c];
            }
            for (var j = 0u; j < REG_N; j++) {
                let b = wt[(wb + tx + j * tnx) * ks + c];
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
