// The expert kernels' interface over block-format weights (moe_gate_up_q_wg,
// moe_down_q_wg: `shader!(FILE, "moe_wq.wgsl", "moe_slot.wgsl", "qblock.wgsl",
// "qgeom.wgsl", ..)`): the bindings in the op's order, the weight buffer bound twice
// (quants, then the scales region), and a row's units for qblock.wgsl's qdot, or
// decoded once (`unit_of`) for several tokens' activations (`unit_dot`: the grouped
// kernels). Needs k a whole number of blocks (qbe()).

struct Dims { rows: u32, experts: u32, top_k: u32, n: u32, k: u32, act: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> route: array<f32>;
@group(0) @binding(2) var<storage, read> wq: array<u32>;
@group(0) @binding(3) var<storage, read> ws: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> dims: Dims;

// Units (quant words) of one weight row.
fn row_units() -> u32 {
    return dims.k / qbe() * qunits();
}

// Unit wi of weight row `row` dotted with the activations from vec4 index xv.
fn row_dot(row: u32, wi: u32, xv: u32) -> f32 {
    return qdot(row * row_units(), wi, xv);
}

// Unit wi of weight row `row` decoded: its values (.lo at the vec4 offset at.x of a
// token's activations, .hi at at.y; q8_0: .lo only).
struct Unit { lo: vec4<f32>, hi: vec4<f32>, at: vec2<u32> }

fn unit_of(row: u32, wi: u32) -> Unit {
    let qu = qunits();
    let base = (wi / qu) * (qbe() / 4u);
    let p = qpos(wi % qu);
    let d = qdecode(row * row_units() + wi);
    return Unit(d.lo, d.hi, vec2<u32>(base + p.x / 4u, base + p.y / 4u));
}

// A decoded unit dotted with the activation row starting at vec4 index xv.
fn unit_dot(u: Unit, xv: u32) -> f32 {
    if (QFMT == 0u) {
        return dot(u.lo, x[xv + u.at.x]);
    }
    return dot(u.lo, x[xv + u.at.x]) + dot(u.hi, x[xv + u.at.y]);
}
