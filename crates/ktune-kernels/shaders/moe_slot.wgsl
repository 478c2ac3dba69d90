// Slot j of token t: the j-th expert (ascending) with a nonzero route, or
// dims.experts when the token has fewer (kernels::problem::Problem::MoeGateUp). Uses
// the interface's `route` and `dims`.
fn slot_expert(t: u32, j: u32) -> u32 {
    var seen = 0u;
    for (var e = 0u; e < dims.experts; e++) {
        if (route[t * dims.experts + e] != 0.0) {
            if (seen == j) {
                return e;
            }
            seen++;
        }
    }
    return dims.experts;
}
