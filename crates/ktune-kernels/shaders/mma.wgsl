// What the matrix-tile GEMMs share (gemm / gate_up, float or block-format weights,
// qgemm_mma.wgsl and gemm_mma.wgsl; on cooperative matrices, heads coop8.wgsl or
// coop16.wgsl with the entry point mma_coop.wgsl, or with the same tiles in plain
// loops, head coop_emu.wgsl with mma_emu.wgsl): the workgroup tiles, the tile geometry, the staging of x into f16
// workgroup tiles, the steps along k (one or two tile buffers), the matrix bases the
// loads and stores use, and the copy of the f32 result matrices to y (with the gated
// activation of gate_up). The weight staging is the weight format's: mma_q.wgsl
// (ggml blocks, dequantized) or mma_f.wgsl (f32 or packed f16 words); each defines
// nchunks(), w_slots(), fetch_w() and store_w(). It reads the head's overrides
// SG_M, SG_N, MAT_M, MAT_N, TILE_K, WGS, W_MATS, STAGES (mma_tiling.wgsl) and MAT
// (the matrix side, 8 or 16), the shader's bindings (x, y, dims: m, n, k, act), and
// act.wgsl's act().
// Requires: mma_tiling.wgsl, act.wgsl.
//
// A workgroup owns a TILE_M x TILE_N tile of y, TILE_M = SG_M·MAT_M·MAT and
// TILE_N = SG_N·MAT_N·MAT: subgroup s (0 .. SG_M·SG_N) owns the MAT_M x MAT_N
// matrices of rows (s / SG_N)·MAT_M·MAT.. and columns (s % SG_N)·MAT_N·MAT.. of it.
// W_MATS weight matrices are multiplied with the same x tile: 1 for gemm (w rows
// n0..), 2 for gate_up (gate rows n0.., up rows dims.n + n0.., staged one after the
// other in wt, accumulated separately, y = act(gate) · up on the way out).
// Per step of TILE_K (whole 32-element chunks of k), x rows and w rows are staged
// row-major at a row stride of TILE_K + 8 halves (16 bytes of padding: the stride is
// not a multiple of 128 bytes, so the rows a matrix load reads start in different
// banks; every row and matrix base stays 16-byte aligned). A (rows of x) loads
// row-major from xs, B (k x n, i.e. rows of w) column-major from wt, both at that
// stride. Each subgroup stores one result matrix (per weight matrix) at a time
// row-major into its slot of cs (MAT·MAT f32; the up matrices' slots after all the
// gate ones), and the whole workgroup copies the slots to y with the edge checks.
//
// Staging goes through registers: an invocation's share of a step is a fixed number
// of slots (x_slots() words of x, w_slots() weight words or units, each a
// vec4<u32>), fetched from global memory PRE at a time by loops of constant trip
// count (so the compiler can unroll them and have every load of a batch in flight
// at once) and then stored to workgroup memory. STAGES 1: each step stages its tiles
// (buffer 0) between two barriers. STAGES 2 (every slot fits the PRE registers):
// two tile buffers; while the matrices of step i are computed from one buffer, the
// invocation's loads for step i + 1 are in flight, stored to the other buffer after
// the matrix work, so a step has one barrier and its load latency hides behind it.

// Registers per invocation for one batch of slots.
const PRE: u32 = 8u;

// The x and weight tiles (f16, STAGES tile buffers each) and the result slots (f32).
var<workgroup> xs: array<f16, STAGES * SG_M * MAT_M * MAT * (TILE_K + 8u)>;
var<workgroup> wt: array<f16, STAGES * W_MATS * SG_N * MAT_N * MAT * (TILE_K + 8u)>;
var<workgroup> cs: array<f32, W_MATS * SG_M * SG_N * MAT * MAT>;
var<private> px: array<vec4<f32>, 8>;
var<private> pw: array<vec4<u32>, 8>;

fn tile_m() -> u32 {
    return SG_M * MAT_M * MAT;
}

fn tile_n() -> u32 {
    return SG_N * MAT_N * MAT;
}

// Row stride of xs and wt, in halves.
fn xstride() -> u32 {
    return TILE_K + 8u;
}

// Halves of one tile buffer of xs, and of wt (every weight matrix's rows).
fn xbuf() -> u32 {
    return tile_m() * xstride();
}

fn wbuf() -> u32 {
    return W_MATS * tile_n() * xstride();
}

// First element of A matrix mi of subgroup row sm at matrix step kk along k, in
// tile buffer buf.
fn a_base(sm: u32, mi: u32, kk: u32, buf: u32) -> u32 {
    return buf * xbuf() + (sm * MAT_M + mi) * MAT * xstride() + kk * MAT;
}

// First element of B matrix nj of weight matrix g, subgroup column sn, at matrix
// step kk along k, in tile buffer buf.
fn b_base(sn: u32, nj: u32, kk: u32, g: u32, buf: u32) -> u32 {
    return buf * wbuf() + (g * tile_n() + (sn * MAT_N + nj) * MAT) * xstride() + kk * MAT;
}

// First element of subgroup s's result slot for weight matrix g in cs.
fn c_slot(s: u32, g: u32) -> u32 {
    return (g * SG_M * SG_N + s) * MAT * MAT;
}

// x words (4 f32) per invocation and step.
fn x_slots() -> u32 {
    return (tile_m() * (TILE_K / 4u) + WGS - 1u) / WGS;
}

// Slot t of x for the step from 32-element chunk c0: word tid + t·WGS of the
// TILE_M x TILE_K tile (zeros past the edges). The fetches have no branches (a slot
// past the edges loads word 0 and drops it), so a batch's loads are one block of
// code the compiler can issue together.
fn fetch_x(c0: u32, tid: u32, m0: u32, t: u32) -> vec4<f32> {
    let kv = TILE_K / 4u;
    let kx = dims.k / 4u;
    let e = tid + t * WGS;
    let r = e / kv;
    let gc = c0 * 8u + e % kv;
    let ok = e < tile_m() * kv && m0 + r < dims.m && gc < kx;
    return select(vec4<f32>(0.0), x[select(0u, (m0 + r) * kx + gc, ok)], ok);
}

// Stores slot t of x, rounded to f16, into tile buffer buf.
fn store_x(buf: u32, tid: u32, t: u32, v: vec4<f32>) {
    let kv = TILE_K / 4u;
    let e = tid + t * WGS;
    if (e < tile_m() * kv) {
        let p = buf * xbuf() + (e / kv) * xstride() + 4u * (e % kv);
        let h = vec4<f16>(v);
        for (var q = 0u; q < 4u; q++) {
            xs[p + q] = h[q];
        }
    }
}

// Loads slots t0 .. t0 + PRE of x and of the weights for the step from chunk c0
// into the registers (a constant trip count: all loads of the batch in flight).
fn fetch(c0: u32, tid: u32, m0: u32, n0: u32, t0: u32) {
    for (var i = 0u; i < PRE; i++) {
        if (t0 + i < x_slots()) {
            px[i] = fetch_x(c0, tid, m0, t0 + i);
        }
        if (t0 + i < w_slots()) {
            pw[i] = fetch_w(c0, tid, n0, t0 + i);
        }
    }
}

// Stores the registers' slots t0 .. t0 + PRE (fetched for chunk c0) into buffer buf.
fn put(c0: u32, buf: u32, tid: u32, t0: u32) {
    for (var i = 0u; i < PRE; i++) {
        if (t0 + i < x_slots()) {
            store_x(buf, tid, t0 + i, px[i]);
        }
        if (t0 + i < w_slots()) {
            store_w(c0, buf, tid, t0 + i, pw[i]);
        }
    }
}

// The step from chunk c0 staged into buffer 0, PRE slots at a time.
fn stage(c0: u32, tid: u32, m0: u32, n0: u32) {
    for (var t0 = 0u; t0 < max(x_slots(), w_slots()); t0 += PRE) {
        fetch(c0, tid, m0, n0, t0);
        put(c0, 0u, tid, t0);
    }
}

// Chunks per step, and the tile buffer step c0 is computed from.
fn kstep() -> u32 {
    return TILE_K / 32u;
}

fn step_buf(c0: u32) -> u32 {
    return select(0u, (c0 / kstep()) % 2u, STAGES == 2u);
}

// Before the first step: STAGES 2 stages it into buffer 0.
fn steps_begin(tid: u32, m0: u32, n0: u32) {
    if (STAGES == 2u) {
        fetch(0u, tid, m0, n0, 0u);
        put(0u, 0u, tid, 0u);
        workgroupBarrier();
    }
}

// Before the matrix work of step c0: STAGES 1 stages it and waits for every
// invocation's part; STAGES 2 has it staged already and puts the loads of the next
// step in flight (unconditionally, so nothing separates them from the matrix work;
// past the last chunk every fetch is guarded to zeros). Returns the step's buffer.
fn step_open(c0: u32, tid: u32, m0: u32, n0: u32) -> u32 {
    if (STAGES == 2u) {
        fetch(c0 + kstep(), tid, m0, n0, 0u);
    } else {
        stage(c0, tid, m0, n0);
        workgroupBarrier();
    }
    return step_buf(c0);
}

// After the matrix work of step c0: STAGES 2 stores the next step into the other
// buffer (nobody reads it: every reader of it finished step c0 - 1 before the last
// barrier); then a barrier, after which this step's buffer may be overwritten and
// the next one is complete.
fn step_close(c0: u32, tid: u32) {
    if (STAGES == 2u && c0 + kstep() < nchunks()) {
        put(c0 + kstep(), 1u - step_buf(c0), tid, 0u);
    }
    workgroupBarrier();
}

// Copies result matrix (mi, nj) of every subgroup from its cs slots to y: the gemm
// result, or act(gate) · up.
fn write_out(mi: u32, nj: u32, tid: u32, m0: u32, n0: u32) {
    let mm = MAT * MAT;
    let slots = SG_M * SG_N * mm;
    for (var e = tid; e < slots; e += WGS) {
        let s = e / mm;
        let r = (e % mm) / MAT;
        let c = e % MAT;
        let row = m0 + ((s / SG_N) * MAT_M + mi) * MAT + r;
        let col = n0 + ((s % SG_N) * MAT_N + nj) * MAT + c;
        if (row < dims.m && col < dims.n) {
            var v = cs[e];
            if (W_MATS == 2u) {
                v = act(v, dims.act == 1u) * cs[slots + e];
            }
            y[row * dims.n + col] = v;
        }
    }
}
