// Head of the shaders on 16x16x16 cooperative matrices (after coop.wgsl): the
// matrix types CoopA, CoopB (f16 inputs) and CoopC (f32 accumulators) and their
// side MAT.
// Requires: coop.wgsl.

alias CoopA = coop_mat16x16<f16, A>;
alias CoopB = coop_mat16x16<f16, B>;
alias CoopC = coop_mat16x16<f32, C>;
const MAT: u32 = 16u;
