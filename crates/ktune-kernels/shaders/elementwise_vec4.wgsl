// Elementwise ops on 16-byte vectors, VPT vec4s per invocation: `gated_act`
// (y = act(gate) * up) and `residual_add` (y = a + b). A workgroup owns WG * VPT
// consecutive vec4s; invocation `lid` handles vec4 lid, lid + WG, ... so every
// load instruction of the workgroup is still contiguous. Needs n % 4 == 0 (checked
// on the host): the buffers are bound as arrays of vec4. The activation (ACT: 0
// silu, 1 gelu_tanh) is act.wgsl's, per component.
// Requires: grid.wgsl.

override WG: u32 = 128;
override VPT: u32 = 2;
override ACT: u32 = 0;

struct Dims { n4: u32 }

@group(0) @binding(0) var<storage, read> in0: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> in1: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> dims: Dims;

// The v-th vec4 of invocation g (v < VPT), or past dims.n4.
fn word(g: Grid, v: u32) -> u32 {
    return wg_linear(g.wid, g.nwg) * WG * VPT + g.lid + v * WG;
}

@compute @workgroup_size(WG)
fn gated_act(g: Grid) {
    for (var v = 0u; v < VPT; v++) {
        let i = word(g, v);
        if (i < dims.n4) { y[i] = act4(in0[i], ACT == 1u) * in1[i]; }
    }
}

@compute @workgroup_size(WG)
fn residual_add(g: Grid) {
    for (var v = 0u; v < VPT; v++) {
        let i = word(g, v);
        if (i < dims.n4) { y[i] = in0[i] + in1[i]; }
    }
}
