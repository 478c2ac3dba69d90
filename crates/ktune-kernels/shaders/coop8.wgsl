// Head of the shaders on 8x8x8 cooperative matrices (after coop.wgsl): the
// matrix types CoopA, CoopB (f16 inputs) and CoopC (f32 accumulators) and their
// side MAT.
// Requires: coop.wgsl.

alias CoopA = coop_mat8x8<f16, A>;
alias CoopB = coop_mat8x8<f16, B>;
alias CoopC = coop_mat8x8<f32, C>;
const MAT: u32 = 8u;
