// Rotary position embedding with one invocation per rotary pair: invocation j of
// head row r = token * heads + h handles slot j of that head, where slots
// 0 .. rot/2 are the pairs (i, i + rot/2) (rotate half) or (2i, 2i + 1)
// (interleaved) and the slots after them copy one pass-through dim each. Every
// invocation forms its own angle: the most parallel layout, the most trig work
// (heads times the cos/sin of rope_shared). Any shape with rot_dim <= head_dim.
//
// The angle pos * f is reduced to [-pi, pi] exactly enough for far positions: pos
// and f are split into 12-bit halves so the four partial products are exact in f32,
// each is reduced by 2pi in three parts (Cody-Waite), and only then do the
// hardware cos/sin run (accurate near zero only on many GPUs). Exact for
// positions below 500000 (checked on the host) and f <= 1 (inverse frequencies).

override WG: u32 = 128;

struct Dims {
    tokens: u32,
    heads: u32,
    head_dim: u32,
    rot_half: u32,
    pos0: u32,
    interleaved: u32, // 0 rotate half, 1 interleaved
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> inv_freq: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

const INV_TAU: f32 = 0.15915494309189535;
const TAU_HI: f32 = 6.28125;                  // 8 significant bits: k * TAU_HI is exact
const TAU_MID: f32 = 0.0019353071693331003;   // f32(2pi - TAU_HI)
const TAU_LO: f32 = 1.0253131677018246e-11;   // 2pi - TAU_HI - TAU_MID

fn reduce(t: f32) -> f32 {
    let k = round(t * INV_TAU);
    return ((t - k * TAU_HI) - k * TAU_MID) - k * TAU_LO;
}

fn rope_angle(pos: u32, f: f32) -> f32 {
    let fh = bitcast<f32>(bitcast<u32>(f) & 0xfffff000u);
    let fl = f - fh;
    let ph = f32(pos & 0xfffff000u);
    let pl = f32(pos & 0xfffu);
    return reduce(reduce(ph * fh) + reduce(ph * fl) + reduce(pl * fh) + reduce(pl * fl));
}

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
        var a = slot;
        var b = slot + half;
        if (dims.interleaved == 1u) {
            a = 2u * slot;
            b = a + 1u;
        }
        let ang = rope_angle(dims.pos0 + row / dims.heads, inv_freq[slot]);
        let c = cos(ang);
        let s = sin(ang);
        let x0 = x[base + a];
        let x1 = x[base + b];
        y[base + a] = x0 * c - x1 * s;
        y[base + b] = x1 * c + x0 * s;
    } else {
        let c = slot + half;
        y[base + c] = x[base + c];
    }
}
