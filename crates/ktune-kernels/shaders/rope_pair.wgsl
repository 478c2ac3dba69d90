// Rotary position embedding with one invocation per rotary pair: invocation j of
// head row r = token * heads + h handles slot j of that head, where slots
// 0 .. rot/2 are the pairs (i, i + rot/2) (rotate half) or (2i, 2i + 1)
// (interleaved) and the slots after them copy one pass-through dim each. Every
// invocation forms its own angle: the most parallel layout, the most trig work
// (heads times the cos/sin of rope_shared). Any shape with rot_dim <= head_dim.
// Includes: rope.wgsl (interface), rotary.wgsl (the exactly reduced angles, the
// pairs, the rotation).

override WG: u32 = 128;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.x + wid.y * nwg.x) * WG + lid;
    let d = dims.head_dim;
    let half = dims.rot_half;
    let slots = d - half; // half pairs + (d - 2 half) copies
    if (idx >= dims.tokens * dims.heads * slots) {
        return;
    }
    let row = idx / slots;
    let slot = idx % slots;
    let base = row * d;
    if (slot < half) {
        let p = base + rope_dims(slot, half, dims.interleaved == 1u);
        let r = rope_rotate(x[p.x], x[p.y], rope_cs(row_position(row / dims.heads), inv_freq[slot]));
        y[p.x] = r.x;
        y[p.y] = r.y;
    } else {
        let c = slot + half;
        y[base + c] = x[base + c];
    }
}
