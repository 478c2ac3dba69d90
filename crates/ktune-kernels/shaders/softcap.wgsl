// The final logit softcapping as the host applies it (tanh(v / cap) * cap when
// cap > 0), on a logit's bits: NaN and infinities as they are. |v / cap| >= 20
// gives tanh = +-1 in f32 anyway; clamped, no overflow inside tanh. Shared by
// select_argmax.wgsl and chain.wgsl's `gather`.

fn softcap_bits(b: u32, cap: f32) -> u32 {
    if (cap > 0.0 && (b & 0x7fffffffu) <= 0x7f800000u) {
        return bitcast<u32>(tanh(clamp(bitcast<f32>(b) / cap, -20.0, 20.0)) * cap);
    }
    return b;
}
