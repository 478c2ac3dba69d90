// Fused RMSNorm prologue + GEMV over a weight of per-operand formats (decode):
// norm_gemv_q_subgroup.wgsl's kernel with its weight stacked from up to three
// row blocks, each in its own block format (kernels::quant::stack: the fused
// Q/K/V or gate/up of a file that stores its parts in different formats, as a
// published Q4_K_M does). Row `row` of the stack lies in part 0 below rows0, in
// part 1 below rows0 + rows1, else in part 2; its part sets the format the block
// decoders read (QFMT: here a private variable set to the part's override before
// the part's loop, where the uniform kernel has one override) and the block the
// part's blocks count from (0, base1, base2: its base block in both regions of
// the buffer, kernels::quant::StackLayout), so qblock.wgsl reads each part as a
// matrix of its own. A subgroup owns a row, so
// its lanes agree on the format; the gate and up rows of a fused gate/up may
// differ in format, so each is its own pass over its units.
// Includes: as norm_gemv_q_subgroup.wgsl.
// Requires: grid_sg.wgsl, grid.wgsl, norm_gemv_sg.wgsl, norm_gemv_q_sg.wgsl.

override WG: u32 = 128;
override ROWS: u32 = 4;
override K4: u32 = 1u;

// The parts' formats (as pipeline constants, so each part's loop is compiled for
// its own format); their rows and base blocks (a uniform: rows of parts 0 and 1,
// base blocks of parts 1 and 2).
override QFMT0: u32 = 0u;
override QFMT1: u32 = 0u;
override QFMT2: u32 = 0u;
override RUNS: u32 = 3u;
struct Parts { rows0: u32, rows1: u32, base1: u32, base2: u32 }

@group(0) @binding(7) var<uniform> parts: Parts;

// The format of the part being read (qblock.wgsl's QFMT), set to a constant
// before each part's loop, which the compiler then specializes.
var<private> QFMT: u32;

// This lane's partial dot with xa of row `r` of the part whose blocks count from
// block `base`, in format QFMT, striding over the row's units.
fn part_dot(s: SgGrid, base: u32, r: u32) -> f32 {
    let qu = qunits();
    let wpr = dims.k / qbe() * qu;
    let u0 = base * qu + r * wpr;
    var acc = 0.0;
    for (var wi = s.lane; wi < wpr; wi += s.sg_size) {
        // Unit j of block bi covers x at qpos(j) within the block (two halves but for q8_0).
        let xb = (wi / qu) * (qbe() / 4u);
        let p = qpos(wi % qu);
        let d = qdecode(u0 + wi);
        acc += dot(d.lo, xa[xb + p.x / 4u]);
        if (QFMT != 0u) {
            acc += dot(d.hi, xa[xb + p.y / 4u]);
        }
    }
    return acc;
}

// This lane's partial dot of stack row `row`: in its part's format from its
// part's base block.
fn row_dot(s: SgGrid, row: u32) -> f32 {
    if (row < parts.rows0) {
        QFMT = QFMT0;
        return part_dot(s, 0u, row);
    }
    if (RUNS == 2u || row < parts.rows0 + parts.rows1) {
        QFMT = QFMT1;
        return part_dot(s, parts.base1, row - parts.rows0);
    }
    QFMT = QFMT2;
    return part_dot(s, parts.base2, row - parts.rows0 - parts.rows1);
}

// This lane's partial dots of row `row`: (gate or the row, up).
fn lane_dots(s: SgGrid, row: u32) -> vec2<f32> {
    let gate = row_dot(s, row);
    if (dims.act != 0u) {
        return vec2<f32>(gate, row_dot(s, row + dims.n));
    }
    return vec2<f32>(gate, 0.0);
}
