// Quantized fused Q/K/V projection of one token: one matrix-vector product over
// the concatenated weight w[nq + 2 nkv, k] in ggml blocks (QFMT: q8_0, q4_0, q4_1,
// dequantized in registers), optional bias, rows routed to q, k_out and v_out.
// Each workgroup owns ROWS consecutive rows; invocations stride over quant words
// and the workgroup reduces through workgroup memory. Needs k % 32 == 0.
//
// Bindings: x, the weight buffer twice (quants at 1, scales region at 2), the bias
// at 3 (a placeholder when HAS_BIAS is false), q, k_out, v_out, the uniform.

override WG: u32 = 128;
override ROWS: u32 = 2;
override QFMT: u32 = 0u;
override HAS_BIAS: bool = false;

struct Dims { k: u32, nq: u32, nkv: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> ws: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> q: array<f32>;
@group(0) @binding(5) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> v_out: array<f32>;
@group(0) @binding(7) var<uniform> dims: Dims;

var<workgroup> partial: array<f32, WG * ROWS>;

// Block decoding (shared text of the q*_ shaders): QFMT 0 = q8_0, 1 = q4_0, 2 = q4_1.
// wq: the quantized bytes as u32 words (8 words per q8_0 block, 4 per 4-bit block),
// ws: the f16 scales as u32 words (d per block; d, m per block for q4_1).

// Quant words per block.
fn qwords() -> u32 {
    return select(4u, 8u, QFMT == 0u);
}

// Scale d and offset m (0 unless q4_1) of global block b.
fn qscale(b: u32) -> vec2<f32> {
    if (QFMT == 2u) {
        return unpack2x16float(ws[b]);
    }
    let pair = unpack2x16float(ws[b >> 1u]);
    return vec2<f32>(select(pair.x, pair.y, (b & 1u) == 1u), 0.0);
}

// Word gw of the quants dequantized: q8_0 gives 4 elements in .lo; the 4-bit
// formats give elements j*4..j*4+3 of the block in .lo and 16 + j*4.. in .hi
// (ggml nibble order), j = word index within its block.
struct QWord { lo: vec4<f32>, hi: vec4<f32> }

fn qdecode(gw: u32) -> QWord {
    let word = wq[gw];
    let sc = qscale(gw / qwords());
    if (QFMT == 0u) {
        let v = (vec4<i32>(bitcast<i32>(word)) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u);
        return QWord(vec4<f32>(v) * sc.x, vec4<f32>(0.0));
    }
    let lo = vec4<f32>((vec4<u32>(word) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u));
    let hi = vec4<f32>((vec4<u32>(word) >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u));
    if (QFMT == 1u) {
        return QWord((lo - 8.0) * sc.x, (hi - 8.0) * sc.x);
    }
    return QWord(lo * sc.x + sc.y, hi * sc.x + sc.y);
}

// Word wi of a row whose quants start at word `rw`, dotted with the activation row
// starting at vec4 index `xv`.
fn qdot(rw: u32, wi: u32, xv: u32) -> f32 {
    let qw = qwords();
    let bi = wi / qw;
    let j = wi % qw;
    let d = qdecode(rw + wi);
    if (QFMT == 0u) {
        return dot(d.lo, x[xv + bi * 8u + j]);
    }
    return dot(d.lo, x[xv + bi * 8u + j]) + dot(d.hi, x[xv + bi * 8u + 4u + j]);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    let n = dims.nq + 2u * dims.nkv;
    let wpr = dims.k / 32u * qwords();
    for (var r = 0u; r < ROWS; r++) {
        partial[r * WG + tid] = 0.0;
    }
    for (var wi = tid; wi < wpr; wi += WG) {
        for (var r = 0u; r < ROWS; r++) {
            let row = row0 + r;
            if (row < n) {
                partial[r * WG + tid] += qdot(row * wpr, wi, 0u);
            }
        }
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            for (var r = 0u; r < ROWS; r++) {
                partial[r * WG + tid] += partial[r * WG + tid + s];
            }
        }
        workgroupBarrier();
    }
    let row = row0 + tid;
    if (tid < ROWS && row < n) {
        var v = partial[tid * WG];
        if (HAS_BIAS) {
            v += bias[row];
        }
        if (row < dims.nq) {
            q[row] = v;
        } else if (row < dims.nq + dims.nkv) {
            k_out[row - dims.nq] = v;
        } else {
            v_out[row - dims.nq - dims.nkv] = v;
        }
    }
}
