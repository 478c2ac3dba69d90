// The expert kernels' interface over block-format weights (moe_gate_up_q_wg,
// moe_down_q_wg: `shader!(FILE, "moe_wq.wgsl", "moe_slot.wgsl", "qblock.wgsl",
// "qgeom.wgsl", ..)`): the bindings in the op's order, the weight buffer bound twice
// (quants, then the scales region), and a row's units for qblock.wgsl's qdot. Needs
// k a whole number of blocks (qbe()).

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
