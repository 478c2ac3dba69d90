// Prefill attention, FlashAttention-style: workgroup (query block, head) owns BQ
// consecutive queries of one head and walks the keys they can see in tiles of BKV
// rows, never materialising the score matrix. Per tile: the K tile is staged in
// workgroup memory (f32), the BQ x BKV scores go to workgroup memory, the V tile
// replaces the K tile, and every query row updates its online softmax state
// (running max m, sum l) and its output accumulator.
// Invocation layout: LANES invocations per query row (WG = BQ * LANES). A lane
// scores keys lane, lane + LANES, ... of the tile and owns the vec4 output columns
// lane, lane + LANES, ... (at most 8: head_dim <= 32 * LANES, checked on the host).
// Query at token i has position kv_len - tokens + i and sees keys (pos - window, pos]
// (up to pos when window == 0); K/V rows past the block's last position are never
// read. Query head h reads KV head h / (heads / kv_heads).
// K/V are u32 words decoded by W_F16 (vec4<u32> = 4 f32 or 8 packed f16), so
// head_dim % 4 == 0 (f32) or % 8 == 0 (f16); HD is specialised by the host.
// Head: attention_dims.wgsl (W_F16, Dims). Includes: attention.wgsl,
// wload.wgsl (W_F16, 16-byte words).
// Requires: attention_dims.wgsl, attention.wgsl.

override BQ: u32 = 16;
override BKV: u32 = 32;
override LANES: u32 = 8;
override HD: u32 = 64;

@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;

var<workgroup> qs: array<vec4<f32>, BQ * HD / 4u>;
var<workgroup> kv: array<vec4<f32>, BKV * HD / 4u>;
var<workgroup> ps: array<f32, BQ * BKV>;

// Stages cache rows t0 .. t0 + BKV (rows past `last` as zeros) of K or V in `kv`.
fn load_tile(is_v: bool, base: u32, t0: u32, last: u32, tid: u32) {
    let rw = wwords16(HD);
    let hd4 = HD / 4u;
    for (var idx = tid; idx < BKV * rw; idx += BQ * LANES) {
        let c = idx / rw;
        let x = idx % rw;
        var w = KvWord(vec4<f32>(0.0), vec4<f32>(0.0));
        if (t0 + c <= last) {
            let gi = (base + t0 + c) * rw + x;
            if (is_v) {
                w = v_word(gi);
            } else {
                w = k_word(gi);
            }
        }
        let ti = c * hd4 + wx16(x);
        kv[ti.x] = w.lo;
        if (W_F16) {
            kv[ti.y] = w.hi;
        }
    }
}

@compute @workgroup_size(BQ * LANES)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let h = wid.y;
    let kh = kv_head(h, dims.heads, dims.kv_heads);
    let heads = dims.heads;
    let past = dims.kv_len - dims.tokens;
    let i0 = wid.x * BQ;
    let rows = min(BQ, dims.tokens - i0);
    let hd4 = HD / 4u;
    let r = tid / LANES;
    let lane = tid % LANES;
    let valid = r < rows;

    for (var idx = tid; idx < BQ * hd4; idx += BQ * LANES) {
        let rr = idx / hd4;
        var v = vec4<f32>(0.0);
        if (rr < rows) {
            v = q[((i0 + rr) * heads + h) * hd4 + idx % hd4] * dims.scale;
        }
        qs[idx] = v;
    }

    // this row's visible keys [span.x, span.y], the block's [klo, khi]
    let span = key_span(past + i0 + min(r, rows - 1u), past + i0, past + i0 + rows - 1u);
    let klo = span.z;
    let khi = span.w;
    let base = kh * dims.kv_cap;
    let ncol = (hd4 + LANES - 1u) / LANES;

    var m = NEG;
    var l = 0.0;
    var acc: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        acc[k] = vec4<f32>(0.0);
    }

    for (var t0 = klo; t0 <= khi; t0 += BKV) {
        workgroupBarrier();
        load_tile(false, base, t0, khi, tid);
        workgroupBarrier();
        for (var c = lane; c < BKV; c += LANES) {
            let j = t0 + c;
            var s = NEG;
            if (valid && j >= span.x && j <= span.y) {
                var a = vec4<f32>(0.0);
                for (var x = 0u; x < hd4; x++) {
                    a += qs[r * hd4 + x] * kv[c * hd4 + x];
                }
                s = a.x + a.y + a.z + a.w;
            }
            ps[r * BKV + c] = s;
        }
        workgroupBarrier();
        load_tile(true, base, t0, khi, tid);
        workgroupBarrier();
        var mt = NEG;
        for (var c = 0u; c < BKV; c++) {
            mt = max(mt, ps[r * BKV + c]);
        }
        let m_new = max(m, mt);
        let alpha = exp(m - m_new);
        l *= alpha;
        for (var k = 0u; k < ncol; k++) {
            acc[k] *= alpha;
        }
        for (var c = 0u; c < BKV; c++) {
            let sv = ps[r * BKV + c];
            if (sv > -1.0e38) {
                let p = exp(sv - m_new);
                l += p;
                for (var k = 0u; k < ncol; k++) {
                    let col = lane + k * LANES;
                    if (col < hd4) {
                        acc[k] += p * kv[c * hd4 + col];
                    }
                }
            }
        }
        m = m_new;
    }

    if (valid) {
        let inv = 1.0 / l;
        let ob = ((i0 + r) * heads + h) * hd4;
        for (var k = 0u; k < ncol; k++) {
            let col = lane + k * LANES;
            if (col < hd4) {
                out[ob + col] = acc[k] * inv;
            }
        }
    }
}
