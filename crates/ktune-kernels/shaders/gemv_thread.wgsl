// GEMV y[n] = w[n,k] · x[k] with one invocation per output row: the row read with
// 16-byte loads into two register accumulators, no workgroup memory, no barrier,
// no reduction. Every invocation reads the whole of x (from cache). Suits adapters
// whose invocations are the SIMD lanes of a CPU-like core (lavapipe) and rows too
// short to share among a workgroup; on a discrete GPU the rows of a workgroup are
// read uncoalesced, which the tuner measures.
// Needs k % 4 == 0 (f32 weights) or k % 8 == 0 (f16 weights).
// Includes: gemv16.wgsl (bindings), wload.wgsl (W_F16, 16-byte words).

override WG: u32 = 64;
override W_F16: bool = false;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * WG;
    if (row >= dims.n) {
        return;
    }
    let words = wwords16(dims.k);
    let base = row * words;
    var acc0 = 0.0;
    var acc1 = 0.0;
    var c = 0u;
    for (; c + 1u < words; c += 2u) {
        let i0 = wx16(c);
        let i1 = wx16(c + 1u);
        acc0 += wdot16(w[base + c], x[i0.x], x[i0.y]);
        acc1 += wdot16(w[base + c + 1u], x[i1.x], x[i1.y]);
    }
    if (c < words) {
        let i = wx16(c);
        acc0 += wdot16(w[base + c], x[i.x], x[i.y]);
    }
    y[row] = acc0 + acc1;
}
