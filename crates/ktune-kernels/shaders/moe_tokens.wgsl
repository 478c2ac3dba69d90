// The grouped expert kernels' walk over an expert's tokens (moe_grouped.wgsl:
// `shader!(FILE, .., "moe_tokens.wgsl")`): the tokens whose route
// to expert e is nonzero, TT at a time in ascending order, gathered with their
// slots of e (a token's slot: the expert's rank among the token's experts,
// ascending, as moe_slot.wgsl counts them) into the including shader's
// `var<workgroup> toks, slots: array<u32, TT>` by its first invocation (the walk
// resumes at `cursor`, a workgroup variable the first invocation sets to 0 first).
// Uses the interface's `route` and `dims`.

// The next tile of expert e's tokens (and their slots) into `toks` (`slots`): how many (0 when none are left),
// the same in every invocation. Call it in uniform control flow (a barrier).
fn next_tokens(tid: u32, e: u32) -> u32 {
    if (tid == 0u) {
        var c = cursor;
        var m = 0u;
        while (c < dims.rows && m < TT) {
            if (route[c * dims.experts + e] != 0.0) {
                toks[m] = c;
                slots[m] = slot_of(c, e);
                m++;
            }
            c++;
        }
        cursor = c;
        ntok = m;
    }
    return workgroupUniformLoad(&ntok);
}

// Token t's slot of expert e: the experts before e with a nonzero route.
fn slot_of(t: u32, e: u32) -> u32 {
    var j = 0u;
    for (var i = 0u; i < e; i++) {
        j += select(0u, 1u, route[t * dims.experts + i] != 0.0);
    }
    return j;
}
