// Elementwise ops with one element per invocation: `gated_act` (y = act(gate) * up)
// and `residual_add` (y = a + b). Any n; every invocation does one load per input
// and one store, so adjacent invocations touch adjacent words (coalesced).
// The activation is a problem constant (ACT: 0 silu, 1 gelu_tanh), specialised in
// the pipeline rather than branched on per element. Includes: act.wgsl.

override WG: u32 = 256;
override ACT: u32 = 0;

struct Dims { n: u32 }

@group(0) @binding(0) var<storage, read> in0: array<f32>;
@group(0) @binding(1) var<storage, read> in1: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

fn index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.x + wid.y * nwg.x) * WG + lid;
}

@compute @workgroup_size(WG)
fn gated_act(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = index(wid, nwg, lid);
    if (i < dims.n) {
        y[i] = act(in0[i], ACT == 1u) * in1[i];
    }
}

@compute @workgroup_size(WG)
fn residual_add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = index(wid, nwg, lid);
    if (i < dims.n) {
        y[i] = in0[i] + in1[i];
    }
}
