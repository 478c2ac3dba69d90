// Weight, gain, bias and KV-cache words, shared by every shader that reads such a
// buffer (`shader!(FILE, .., "wload.wgsl")`): the buffers are bound as u32 words
// (or 16-byte vec4<u32> words) holding f32 bits, or two packed f16 per u32 when
// W_F16, so one shader serves both dtypes without SHADER_F16. The including shader
// declares `override W_F16: bool` (includes declare no overrides: every one a shader
// has stays in its own file, declared before anything that uses it); the functions
// take words and indices, never a binding, so the shader reads its own buffers:
// `wpick(w[wword(i)], i)` is element i of `w`, `wdot16(w[rw + c], x[xi.x], x[xi.y])`
// with `xi = xr + wx16(c)` the dot of 16-byte word c of a row with the activations
// it multiplies.

// Index of the u32 word holding element i.
fn wword(i: u32) -> u32 {
    return select(i, i >> 1u, W_F16);
}

// Element i from the u32 word holding it.
fn wpick(word: u32, i: u32) -> f32 {
    if (W_F16) {
        let pair = unpack2x16float(word);
        return select(pair.x, pair.y, (i & 1u) == 1u);
    }
    return bitcast<f32>(word);
}

// 16-byte words holding n elements (n / 4 f32 or n / 8 f16).
fn wwords16(n: u32) -> u32 {
    return select(n / 4u, n / 8u, W_F16);
}

// Elements 0..4 of a 16-byte word.
fn wlo4(q: vec4<u32>) -> vec4<f32> {
    if (W_F16) {
        return vec4<f32>(unpack2x16float(q.x), unpack2x16float(q.y));
    }
    return bitcast<vec4<f32>>(q);
}

// Elements 4..8 of a 16-byte word of packed f16 (meaningless for f32).
fn whi4(q: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(q.z), unpack2x16float(q.w));
}

// vec4 indices, relative to the row's first, of the activations that 16-byte word c
// of a row multiplies: .x elements 0..4, .y elements 4..8 (f16; .y == .x for f32).
fn wx16(c: u32) -> vec2<u32> {
    return select(vec2<u32>(c), vec2<u32>(2u * c, 2u * c + 1u), W_F16);
}

// xa · elements 0..4 of q + xb · elements 4..8 (f16 only), as one dot product sum.
fn wdot16(q: vec4<u32>, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    if (W_F16) {
        return dot(xa, wlo4(q)) + dot(xb, whi4(q));
    }
    return dot(xa, wlo4(q));
}

// The same products left per component (summed by the caller when it wants).
fn wmul16(q: vec4<u32>, xa: vec4<f32>, xb: vec4<f32>) -> vec4<f32> {
    if (W_F16) {
        return xa * wlo4(q) + xb * whi4(q);
    }
    return xa * wlo4(q);
}
