// Quantized fused gate+up: y[t, j] = act(x[t]·w[j]) * (x[t]·w[n + j]) with w[2n, k]
// in ggml blocks (QFMT: q8_0, q4_0, q4_1) dequantized in registers. Workgroup
// (wid.x, t) owns ROWS features of token t; each invocation strides over quant
// words for the gate and up rows of all of them, the workgroup reduces through
// workgroup memory and applies the activation in the epilogue. Needs k % 32 == 0.
//
// Bindings: x, the weight buffer twice (quants at 1, the scales region at 2), y,
// the uniform.

override WG: u32 = 128;
override ROWS: u32 = 2;
override QFMT: u32 = 0u;

struct Dims { rows: u32, n: u32, k: u32, act: u32 } // act: 0 silu, 1 gelu_tanh

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> ws: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

var<workgroup> partial: array<f32, 2 * WG * ROWS>;

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

fn act(g: f32) -> f32 {
    if (dims.act == 1u) {
        let t = tanh(clamp(0.7978845608028654 * (g + 0.044715 * g * g * g), -15.0, 15.0));
        return 0.5 * g * (1.0 + t);
    }
    return g / (1.0 + exp(-g));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let j0 = wid.x * ROWS;
    let t = wid.y;
    let n = dims.n;
    let wpr = dims.k / 32u * qwords();
    let xv = t * (dims.k / 4u);
    for (var r = 0u; r < 2u * ROWS; r++) {
        partial[r * WG + tid] = 0.0;
    }
    for (var wi = tid; wi < wpr; wi += WG) {
        for (var r = 0u; r < ROWS; r++) {
            let j = j0 + r;
            if (j < n) {
                partial[r * WG + tid] += qdot(j * wpr, wi, xv);
                partial[(ROWS + r) * WG + tid] += qdot((n + j) * wpr, wi, xv);
            }
        }
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            for (var r = 0u; r < 2u * ROWS; r++) {
                partial[r * WG + tid] += partial[r * WG + tid + s];
            }
        }
        workgroupBarrier();
    }
    if (tid < ROWS && j0 + tid < n && t < dims.rows) {
        y[t * n + j0 + tid] = act(partial[tid * WG]) * partial[(ROWS + tid) * WG];
    }
}
