// Fused RMSNorm prologue + GEMV (decode), reduced with subgroup operations:
// y[n] = w[n,k] · (x * inv_rms * g'), g' = g or 1 + g (unit_offset, Gemma),
// inv_rms = 1 / sqrt(mean(x²) + eps). The workgroup first forms x·g' once into
// workgroup memory (K4 = k / 4 vec4s), summing x² alongside (wg_total), then each
// subgroup owns whole rows (sg, sg + num_subgroups, ... of the workgroup's ROWS):
// its lanes load 16 bytes of the row per step, dot them with x·g', and one
// subgroupAdd finishes the row, scaled by inv_rms. The gain and the weights are
// vec4<u32> words decoded by W_F16 (4 f32 or 8 packed f16). Needs SUBGROUP and
// k % 4 == 0 (f32) or k % 8 == 0 (f16).
//
// The decode chain's forms (dims.residual, dims.act): the input is x + r
// (residual 1) or x + rmsnorm(r) * g_r' (2: Gemma's post-norms, r² summed over the
// workgroup first), formed in the same prologue and written once to h by the first
// workgroup (no other workgroup reads h); with an activation (1 +
// Activation::code) the weight is the fused gate/up [2n, k] and each row r dots
// rows r and n + r: y[r] = act(gate) * up. Without them the host binds x, g and y
// in place of r, g_r and h (never read or written).
// Includes: wload.wgsl (W_F16, 16-byte words), act.wgsl, norm_gemv_sg.wgsl (prologue, rows).
// Requires: grid_sg.wgsl, grid.wgsl, norm_gemv_sg.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override W_F16: bool = false;
override K4: u32 = 1u;

struct Dims { n: u32, k: u32, eps: f32, unit_offset: u32, residual: u32, act: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> g: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;
@group(0) @binding(5) var<storage, read> r: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> g_r: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> h: array<f32>;

// x·g' (the normalized input before its 1 / rms), by vec4.
var<workgroup> xa: array<vec4<f32>, K4>;
var<workgroup> sums: array<f32, WG>;

// Elements 4i..4i+4 of a gain stored as 16-byte words, as applied (g or 1 + g).
fn gain4(q: vec4<u32>, i: u32) -> vec4<f32> {
    let v = select(wlo4(q), select(wlo4(q), whi4(q), (i & 1u) == 1u), W_F16);
    return v + vec4<f32>(select(0.0, 1.0, dims.unit_offset != 0u));
}

// The norm's and the residual norm's gains of vec4 c (prologue()).
fn gain(c: u32) -> vec4<f32> {
    return gain4(g[c >> select(0u, 1u, W_F16)], c);
}
fn gain_r(c: u32) -> vec4<f32> {
    return gain4(g_r[c >> select(0u, 1u, W_F16)], c);
}

// This lane's partial dots of row `row` with xa: (gate or the row, up).
fn lane_dots(s: SgGrid, row: u32) -> vec2<f32> {
    let words = wwords16(dims.k);
    var acc = vec2<f32>(0.0);
    for (var c = s.lane; c < words; c += s.sg_size) {
        let xi = wx16(c);
        let a0 = xa[xi.x];
        let a1 = xa[xi.y];
        acc.x += wdot16(w[row * words + c], a0, a1);
        if (dims.act != 0u) {
            acc.y += wdot16(w[(row + dims.n) * words + c], a0, a1);
        }
    }
    return acc;
}

@compute @workgroup_size(WG)
fn main(s: SgGrid) {
    let first = wg_linear(s.wid, s.nwg);
    rows(s, first, prologue(s, first));
}
