// Rotary position embedding with one workgroup per (token, group of HEADS heads):
// the workgroup first computes cos and sin of each of the rot/2 frequencies once
// into workgroup memory, then rotates the pairs of all its heads from that table,
// so the trig work is shared by HEADS heads (decode: all heads of the token in a
// few workgroups; prefill: many tokens). HALF_CAP >= rot/2 sizes the table (set by
// the host from the problem). Pairs: (i, i + rot/2) or (2i, 2i + 1); dims past
// rot_dim copied. Angles are reduced exactly as in rope_pair.wgsl.

override WG: u32 = 64;
override HEADS: u32 = 4;
override HALF_CAP: u32 = 64;

struct Dims {
    tokens: u32,
    heads: u32,
    head_dim: u32,
    rot_half: u32,
    pos0: u32,
    interleaved: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> inv_freq: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

var<workgroup> cs: array<vec2<f32>, HALF_CAP>;

const INV_TAU: f32 = 0.15915494309189535;
const TAU_HI: f32 = 6.28125;
const TAU_MID: f32 = 0.0019353071693331003;
const TAU_LO: f32 = 1.0253131677018246e-11;

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
        @builtin(local_invocation_index) tid: u32) {
    let group = wid.x + wid.y * nwg.x;
    let per_token = (dims.heads + HEADS - 1u) / HEADS;
    let token = group / per_token;
    if (token >= dims.tokens) {
        return;
    }
    let h0 = (group % per_token) * HEADS;
    let d = dims.head_dim;
    let half = dims.rot_half;
    let pos = dims.pos0 + token;
    for (var i = tid; i < half; i += WG) {
        let ang = rope_angle(pos, inv_freq[i]);
        cs[i] = vec2<f32>(cos(ang), sin(ang));
    }
    workgroupBarrier();
    let nh = min(HEADS, dims.heads - h0);
    let slots = d - half;
    for (var j = tid; j < nh * slots; j += WG) {
        let slot = j % slots;
        let base = (token * dims.heads + h0 + j / slots) * d;
        if (slot < half) {
            var a = slot;
            var b = slot + half;
            if (dims.interleaved == 1u) {
                a = 2u * slot;
                b = a + 1u;
            }
            let t = cs[slot];
            let x0 = x[base + a];
            let x1 = x[base + b];
            y[base + a] = x0 * t.x - x1 * t.y;
            y[base + b] = x1 * t.x + x0 * t.y;
        } else {
            let c = slot + half;
            y[base + c] = x[base + c];
        }
    }
}
