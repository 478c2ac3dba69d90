// The expert kernels' interface over float weights (moe_gate_up_wg, moe_down_wg:
// `shader!(FILE, "moe_wf.wgsl", "moe_slot.wgsl", "wload.wgsl", ..)`): the bindings in
// the op's order, weights as u32 words (f32 bits, or packed f16 pairs when W_F16),
// and a row read 4 elements a unit (`unit_of`, `unit_dot`: once for several tokens in
// the grouped kernels). Needs k a multiple of 4.

struct Dims { rows: u32, experts: u32, top_k: u32, n: u32, k: u32, act: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> route: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> dims: Dims;

// Units (4 elements each) of one weight row.
fn row_units() -> u32 {
    return dims.k / 4u;
}

// Unit wi of weight row `row` read: its 4 values, at vec4 offset wi of a token's
// activations (the grouped kernels read it once for several tokens).
struct Unit { lo: vec4<f32>, hi: vec4<f32>, at: vec2<u32> }

fn unit_of(row: u32, wi: u32) -> Unit {
    let i = row * dims.k + 4u * wi;
    let v = vec4<f32>(wpick(w[wword(i)], i), wpick(w[wword(i + 1u)], i + 1u), wpick(w[wword(i + 2u)], i + 2u), wpick(w[wword(i + 3u)], i + 3u));
    return Unit(v, vec4<f32>(0.0), vec2<u32>(wi, wi));
}

// A read unit dotted with the activation row starting at vec4 index xv.
fn unit_dot(u: Unit, xv: u32) -> f32 {
    return dot(u.lo, x[xv + u.at.x]);
}

// Unit wi of weight row `row` dotted with the activations from vec4 index xv.
fn row_dot(row: u32, wi: u32, xv: u32) -> f32 {
    return unit_dot(unit_of(row, wi), xv);
}
