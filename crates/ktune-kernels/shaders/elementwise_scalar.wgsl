// Elementwise ops with one element per invocation: `gated_act` (y = act(gate) * up)
// and `residual_add` (y = a + b). Any n; every invocation does one load per input
// and one store, so adjacent invocations touch adjacent words (coalesced).
// The activation is a problem constant (ACT: 0 silu, 1 gelu_tanh), specialised in
// the pipeline rather than branched on per element. Includes: act.wgsl.
// Requires: grid.wgsl.

override WG: u32 = 256;
override ACT: u32 = 0;

struct Dims { n: u32 }

@group(0) @binding(0) var<storage, read> in0: array<f32>;
@group(0) @binding(1) var<storage, read> in1: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

@compute @workgroup_size(WG)
fn gated_act(g: Grid) {
    let i = invocation(g);
    if (i < dims.n) {
        y[i] = act(in0[i], ACT == 1u) * in1[i];
    }
}

@compute @workgroup_size(WG)
fn residual_add(g: Grid) {
    let i = invocation(g);
    if (i < dims.n) {
        y[i] = in0[i] + in1[i];
    }
}
