// The gated activations (silu, gelu_tanh), shared by the elementwise and the fused
// gate+up shaders (`shader!(FILE, .., "act.wgsl")`); pure functions.
//
// Both as g * sigmoid(k): silu k = g, gelu_tanh k = 2 * sqrt(2/pi) * (g + 0.044715 g^3)
// (0.5 (1 + tanh(z)) = sigmoid(2z)). k is clamped so exp never overflows (the result
// is 0 to f32 precision there anyway).
fn act(g: f32, gelu: bool) -> f32 {
    var k = g;
    if (gelu) {
        k = 1.5957691216057308 * (g + 0.044715 * g * g * g);
    }
    return g / (1.0 + exp(-max(k, -80.0)));
}

// act per component.
fn act4(g: vec4<f32>, gelu: bool) -> vec4<f32> {
    return vec4<f32>(act(g.x, gelu), act(g.y, gelu), act(g.z, gelu), act(g.w, gelu));
}
