// Prefill attention on 16x16x16 matrices, flash style in two passes: S = Q·Kᵀ and
// O += P·V as f16 matrices with f32 accumulation, O held in the matrix registers for
// the whole block (the softmax's maxima come from a first pass over the scores, so O
// is never rescaled). On cooperative matrices (wgpu's EXPERIMENTAL_COOPERATIVE_MATRIX:
// NVIDIA tensor cores, Apple simdgroup matrices, Intel XMX; heads coop16.wgsl and
// attention_dims.wgsl, entry attn_mma_coop.wgsl; needs subgroups of exactly
// 32) or the same tiles in plain loops with virtual subgroups of 32 invocations
// (heads coop_emu.wgsl and attention_dims.wgsl, entry attn_mma_emu.wgsl).
// Needs head_dim a multiple of 16. This file: the block a workgroup owns, the
// staging of Q and of K/V tiles as f16 in workgroup memory, the masks, and the row
// passes of the softmax.
//
// A workgroup owns BQ consecutive query tokens of one query head (grid x: query
// blocks, y: heads). Two passes over the block's visible keys [klo, khi] in tiles
// of BK keys: the first computes each tile's scores S = Q·Kᵀ (matrix ops) only for
// the rows' maxima; the second computes S again, P = exp(S - m) with the final
// maxima (so the output accumulators are never rescaled and stay in the matrix
// units' registers: no row scaling of a cooperative matrix is needed), the rows'
// sums of P, and O += P·V (matrix ops); the output is O / sum. The second Q·Kᵀ is the
// price of keeping O in matrix registers (on matrix units the cheap part; K is read
// twice).
// Q is pre-scaled and rounded to f16 once (qs, BQ rows of HD + 8 halves); K, then
// V, of a tile go through one f16 buffer (kv, BK rows at the same stride: 16 bytes
// of padding so consecutive rows start in different banks, every matrix base
// 16-byte aligned); S in f32 (ss, BQ x BK), P in f16 (ps, rows of BK + 8 halves).
// Row r (token i0 + r, position kv_len - tokens + i0 + r) sees keys key_lo..key_hi
// (attention.wgsl: the causal range, the sliding window, the bidirectional block).
// K/V are read as 16-byte words of f32 or packed f16 (W_F16, wload.wgsl).
// Bindings q@0 k_cache@1 v_cache@2 out@3 dims@4. Includes: the entry point,
// attention.wgsl, wload.wgsl.
// Requires: attention_dims.wgsl, attention.wgsl.

override BQ: u32 = 16;   // query tokens per workgroup (a multiple of 16)
override BK: u32 = 32;   // keys per tile (a multiple of 16)
override NSG: u32 = 2;   // subgroups (emulation: virtual subgroups of 32 invocations)
override WGS: u32 = 64;  // NSG * 32
override NS: u32 = 1;    // S matrices per subgroup and tile: ceil((BQ / 16)(BK / 16) / NSG)
override NO: u32 = 2;    // O matrices per subgroup: ceil((BQ / 16)(HD / 16) / NSG) <= 8
override HD: u32 = 64;

@group(0) @binding(3) var<storage, read_write> out: array<f32>;

var<workgroup> qs: array<f16, BQ * (HD + 8u)>;
var<workgroup> kv: array<f16, BK * (HD + 8u)>;
var<workgroup> ss: array<f32, BQ * BK>;
var<workgroup> ps: array<f16, BQ * (BK + 8u)>;
var<workgroup> rm: array<f32, BQ>;
var<workgroup> rl: array<f32, BQ>;

// Row stride of qs and kv, in halves.
fn qstride() -> u32 {
    return HD + 8u;
}

// Row stride of ps, in halves.
fn pstride() -> u32 {
    return BK + 8u;
}

// The workgroup's block: query head h, its KV head kh, first token i0, tokens ntok,
// the position of token 0, and the keys any of its rows sees [klo, khi].
struct Blk {
    h: u32,
    kh: u32,
    i0: u32,
    ntok: u32,
    past: u32,
    klo: u32,
    khi: u32,
}

fn block(wid: vec3<u32>) -> Blk {
    let h = wid.y;
    let i0 = wid.x * BQ;
    let ntok = min(BQ, dims.tokens - i0);
    let past = dims.kv_len - dims.tokens;
    // key_lo and key_hi never decrease with the position
    let klo = key_lo(past + i0, dims.window, dims.b0, dims.b1);
    let khi = key_hi(past + i0 + ntok - 1u, dims.b0, dims.b1);
    return Blk(h, kv_head(h, dims.heads, dims.kv_heads), i0, ntok, past, klo, khi);
}

// Tiles of BK keys covering [klo, khi].
fn ntiles(b: Blk) -> u32 {
    return (b.khi - b.klo) / BK + 1u;
}

// Whether row r sees key j.
fn visible(b: Blk, r: u32, j: u32) -> bool {
    if (r >= b.ntok) {
        return false;
    }
    let pos = b.past + b.i0 + r;
    return j >= key_lo(pos, dims.window, dims.b0, dims.b1) && j <= key_hi(pos, dims.b0, dims.b1);
}

// Q rows of the block, pre-scaled, as f16 (rows past the block's tokens: zeros).
fn stage_q(b: Blk, tid: u32) {
    let hd4 = HD / 4u;
    for (var e = tid; e < BQ * hd4; e += WGS) {
        let r = e / hd4;
        let c = e % hd4;
        var v = vec4<f32>(0.0);
        if (r < b.ntok) {
            v = q[((b.i0 + r) * dims.heads + b.h) * hd4 + c] * dims.scale;
        }
        let hv = vec4<f16>(v);
        for (var t = 0u; t < 4u; t++) {
            qs[r * qstride() + 4u * c + t] = hv[t];
        }
    }
}

// Cache rows t0 .. t0 + BK of K or V as f16 in kv (rows past khi: zeros).
fn stage_kv(is_v: bool, b: Blk, t0: u32, tid: u32) {
    let rw = wwords16(HD);
    let epw = select(4u, 8u, W_F16);
    for (var e = tid; e < BK * rw; e += WGS) {
        let c = e / rw;
        let x = e % rw;
        var w = vec4<u32>(0u);
        if (t0 + c <= b.khi) {
            let gi = (b.kh * dims.kv_cap + t0 + c) * rw + x;
            if (is_v) {
                w = vc[gi];
            } else {
                w = kc[gi];
            }
        }
        let o = c * qstride() + x * epw;
        let lo = vec4<f16>(wlo4(w));
        for (var t = 0u; t < 4u; t++) {
            kv[o + t] = lo[t];
        }
        if (W_F16) {
            let hi = vec4<f16>(whi4(w));
            for (var t = 0u; t < 4u; t++) {
                kv[o + 4u + t] = hi[t];
            }
        }
    }
}

// The start of a block: Q staged, the rows' running maxima and sums reset.
fn begin(b: Blk, tid: u32) {
    stage_q(b, tid);
    for (var r = tid; r < BQ; r += WGS) {
        rm[r] = NEG;
        rl[r] = 0.0;
    }
}

// K of the tile from key t0 staged in kv, once every reader of the previous tile
// is done; the barriers on both sides.
fn stage_k(b: Blk, t0: u32, tid: u32) {
    workgroupBarrier();
    stage_kv(false, b, t0, tid);
    workgroupBarrier();
}

// Pass 2, after the tile's S (in ss, and a barrier): P and the rows' sums, then V
// staged in kv (K's readers are done), a barrier before P·V reads ps and kv.
fn p_and_v(b: Blk, t0: u32, tid: u32) {
    tile_p(b, t0, tid);
    workgroupBarrier();
    rows_sum(tid);
    stage_kv(true, b, t0, tid);
    workgroupBarrier();
}

// After a tile's S is in ss: the barrier, then pass 1's row maxima (false: no P·V
// this sweep) or pass 2's P and staged V (true: P·V follows).
fn scores_done(b: Blk, t0: u32, tid: u32, sweep: u32) -> bool {
    workgroupBarrier();
    if (sweep == 0u) {
        rows_max(b, t0, tid);
        return false;
    }
    p_and_v(b, t0, tid);
    return true;
}

// Pass 1: the rows' maxima over the tile's visible scores (ss).
fn rows_max(b: Blk, t0: u32, tid: u32) {
    for (var r = tid; r < BQ; r += WGS) {
        var m = rm[r];
        for (var c = 0u; c < BK; c++) {
            if (visible(b, r, t0 + c)) {
                m = max(m, ss[r * BK + c]);
            }
        }
        rm[r] = m;
    }
}

// Pass 2: P = exp(S - m) of the visible scores (zeros elsewhere) as f16 in ps.
fn tile_p(b: Blk, t0: u32, tid: u32) {
    for (var e = tid; e < BQ * BK; e += WGS) {
        let r = e / BK;
        let c = e % BK;
        var p = 0.0;
        if (visible(b, r, t0 + c)) {
            p = exp(ss[e] - rm[r]);
        }
        ps[r * pstride() + c] = f16(p);
    }
}

// Pass 2: the rows' sums of the tile's P as P·V sees it (the f16 values).
fn rows_sum(tid: u32) {
    for (var r = tid; r < BQ; r += WGS) {
        var l = rl[r];
        for (var c = 0u; c < BK; c++) {
            l += f32(ps[r * pstride() + c]);
        }
        rl[r] = l;
    }
}

// Output element (row r of the block, column c) from its accumulated value.
fn write_o(b: Blk, r: u32, c: u32, v: f32) {
    if (r < b.ntok) {
        out[((b.i0 + r) * dims.heads + b.h) * HD + c] = v / rl[r];
    }
}
