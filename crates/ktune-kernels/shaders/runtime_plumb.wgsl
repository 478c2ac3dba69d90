// The runtime's own data movement (not tuned kernels): splitting a fused QKV
// projection into q, k and v (adding the bias), a broadcast bias add in place,
// and writing new K/V rows into the head-major cache ([kv_heads, kv_cap, head_dim])
// as f32 or as packed f16 pairs at position.wgsl's pos0 (the block's `e` word is
// not read), or into a paged pool ([blocks, kv_heads, page, head_dim]) at each
// row's own position and block (`kv_write_rows_*`: a batch of sequences; f32,
// f16, or q8_0 blocks quantized as the CPU's KV write quantizes them).
// Requires: grid.wgsl, position.wgsl.

override WG: u32 = 256;

struct Dims {
    a: u32,   // split: tokens        bias: rows   kv: tokens
    b: u32,   // split: nq            bias: n      kv: kv_heads
    c: u32,   // split: nkv           -            kv: head_dim
    d: u32,   // split: has_bias      -            kv: kv_cap; kv rows: page
    e: u32,   //                                   kv: pos0; kv rows: rows
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> bias: array<f32>;
@group(0) @binding(2) var<storage, read_write> q: array<f32>;
@group(0) @binding(3) var<storage, read_write> k: array<f32>;
@group(0) @binding(4) var<storage, read_write> v: array<f32>;
@group(0) @binding(5) var<uniform> dims: Dims;

@compute @workgroup_size(WG)
fn split_qkv(g: Grid) {
    let i = invocation(g);
    let nq = dims.b;
    let nkv = dims.c;
    let w = nq + 2u * nkv;
    if (i >= dims.a * w) {
        return;
    }
    let t = i / w;
    let j = i % w;
    var x = src[i];
    if (dims.d != 0u) {
        x += bias[j];
    }
    if (j < nq) {
        q[t * nq + j] = x;
    } else if (j < nq + nkv) {
        k[t * nkv + j - nq] = x;
    } else {
        v[t * nkv + j - nq - nkv] = x;
    }
}

@group(0) @binding(0) var<storage, read> badd_bias: array<f32>;
@group(0) @binding(1) var<storage, read_write> badd_buf: array<f32>;
@group(0) @binding(2) var<uniform> badd_dims: Dims;

@compute @workgroup_size(WG)
fn bias_add(g: Grid) {
    let i = invocation(g);
    if (i >= badd_dims.a * badd_dims.b) {
        return;
    }
    badd_buf[i] += badd_bias[i % badd_dims.b];
}

// Cache index of element i of the new rows src[tokens, kv_heads, head_dim]:
// cache[(h * cap + pos0 + t) * d + e] for i = (t * kvh + h) * d + e.
fn kv_index(i: u32, kd: Dims) -> u32 {
    let d = kd.c;
    let kvh = kd.b;
    let t = i / (kvh * d);
    let h = (i / d) % kvh;
    let e = i % d;
    return (h * kd.d + position.pos0 + t) * d + e;
}

@group(0) @binding(0) var<storage, read> kv_src: array<f32>;
@group(0) @binding(1) var<storage, read_write> kv_cache_f32: array<f32>;
@group(0) @binding(2) var<uniform> kv_dims: Dims;

// One invocation per element.
@compute @workgroup_size(WG)
fn kv_write_f32(g: Grid) {
    let i = invocation(g);
    if (i < kv_dims.a * kv_dims.b * kv_dims.c) {
        kv_cache_f32[kv_index(i, kv_dims)] = kv_src[i];
    }
}

@group(0) @binding(0) var<storage, read> kvh_src: array<f32>;
@group(0) @binding(1) var<storage, read_write> kv_cache_f16: array<u32>;
@group(0) @binding(2) var<uniform> kvh_dims: Dims;

// One invocation per pair of elements (head_dim is even), packed as two f16.
@compute @workgroup_size(WG)
fn kv_write_f16(g: Grid) {
    let i = invocation(g) * 2u;
    if (i < kvh_dims.a * kvh_dims.b * kvh_dims.c) {
        kv_cache_f16[kv_index(i, kvh_dims) / 2u] = pack2x16float(vec2<f32>(kvh_src[i], kvh_src[i + 1u]));
    }
}

// A paged pool's index of element i = (t * kvh + h) * d + e of the new rows
// src[tokens, kv_heads, head_dim], row t at position `pos` in pool block `block`
// (the pass's rows buffer, written by the host: rows[t], then rows[kd.e + t]).
fn kv_rows_index(i: u32, kd: Dims, pos: u32, block: u32) -> u32 {
    let d = kd.c;
    let kvh = kd.b;
    let h = (i / d) % kvh;
    return ((block * kvh + h) * kd.d + pos % kd.d) * d + i % d;
}

@group(0) @binding(0) var<storage, read> kvr_src: array<f32>;
@group(0) @binding(1) var<storage, read_write> kvr_cache_f32: array<f32>;
@group(0) @binding(2) var<uniform> kvr_dims: Dims;
@group(0) @binding(3) var<storage, read> kvr_rows: array<u32>;

@compute @workgroup_size(WG)
fn kv_write_rows_f32(g: Grid) {
    let i = invocation(g);
    let kd = kvr_dims;
    if (i < kd.a * kd.b * kd.c) {
        let t = i / (kd.b * kd.c);
        kvr_cache_f32[kv_rows_index(i, kd, kvr_rows[t], kvr_rows[kd.e + t])] = kvr_src[i];
    }
}

@group(0) @binding(0) var<storage, read> kvrh_src: array<f32>;
@group(0) @binding(1) var<storage, read_write> kvrh_cache_f16: array<u32>;
@group(0) @binding(2) var<uniform> kvrh_dims: Dims;
@group(0) @binding(3) var<storage, read> kvrh_rows: array<u32>;

// One invocation per pair of elements (head_dim is even), packed as two f16.
@compute @workgroup_size(WG)
fn kv_write_rows_f16(g: Grid) {
    let i = invocation(g) * 2u;
    let kd = kvrh_dims;
    if (i < kd.a * kd.b * kd.c) {
        let t = i / (kd.b * kd.c);
        let at = kv_rows_index(i, kd, kvrh_rows[t], kvrh_rows[kd.e + t]);
        kvrh_cache_f16[at / 2u] = pack2x16float(vec2<f32>(kvrh_src[i], kvrh_src[i + 1u]));
    }
}

struct KvQ8Dims {
    a: u32,       // tokens
    b: u32,       // kv_heads
    c: u32,       // head_dim (whole blocks of 32)
    d: u32,       // kv: kv_cap; kv rows: page
    e: u32,       // kv rows: rows
    scales: u32,  // the cache's first scale word
}

@group(0) @binding(0) var<storage, read> kvrq_src: array<f32>;
@group(0) @binding(1) var<storage, read_write> kvrq_pool: array<atomic<u32>>;
@group(0) @binding(2) var<uniform> kvrq_dims: KvQ8Dims;
@group(0) @binding(3) var<storage, read> kvrq_rows: array<u32>;

// The 32 new values from src[e0] quantized into the cache's block b as ggml's
// quantize_row_q8_0 (kernels::quant's BlockQ8_0): d = amax / 127, each code
// round(x / d) half away from zero, d stored as f16. The cache is a q8_0
// matrix's single-buffer layout (QMatrix::gpu_bytes): 8 words of codes a block,
// then the f16 scales from word `scales` on, two a word: a block sets its half
// of a scale word atomically (its neighbour may be written by another
// invocation).
fn kv_q8_block(e0: u32, b: u32) {
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(kvrq_src[e0 + j]));
    }
    let d = amax / 127.0;
    let id = select(0.0, 1.0 / d, d != 0.0);
    for (var w = 0u; w < 8u; w++) {
        var word = 0u;
        for (var j = 0u; j < 4u; j++) {
            let r = kvrq_src[e0 + 4u * w + j] * id;
            let f = floor(abs(r));
            let q = i32(f + select(0.0, 1.0, abs(r) - f >= 0.5)) * select(1, -1, r < 0.0);
            word |= (bitcast<u32>(q) & 255u) << (8u * j);
        }
        atomicStore(&kvrq_pool[8u * b + w], word);
    }
    let half = b % 2u;
    let bits = pack2x16float(vec2<f32>(d, 0.0)) & 0xffffu;
    let sw = kvrq_dims.scales + b / 2u;
    atomicAnd(&kvrq_pool[sw], select(0xffff0000u, 0x0000ffffu, half == 1u));
    atomicOr(&kvrq_pool[sw], bits << (16u * half));
}

// The first five words: the f32 and f16 writes' uniform (their index functions).
fn kvq_dims() -> Dims {
    let kd = kvrq_dims;
    return Dims(kd.a, kd.b, kd.c, kd.d, kd.e);
}

// One invocation per block of 32 new values, into the head-major cache at
// position.wgsl's pos0 (as kv_write_f32).
@compute @workgroup_size(WG)
fn kv_write_q8(g: Grid) {
    let e0 = 32u * invocation(g);
    let kd = kvq_dims();
    if (e0 < kd.a * kd.b * kd.c) {
        kv_q8_block(e0, kv_index(e0, kd) / 32u);
    }
}

// One invocation per block of 32 new values, into a paged pool at each row's
// position and block (as kv_write_rows_f32).
@compute @workgroup_size(WG)
fn kv_write_rows_q8(g: Grid) {
    let e0 = 32u * invocation(g);
    let kd = kvq_dims();
    if (e0 < kd.a * kd.b * kd.c) {
        let t = e0 / (kd.b * kd.c);
        kv_q8_block(e0, kv_rows_index(e0, kd, kvrq_rows[t], kvrq_rows[kd.e + t]) / 32u);
    }
}
