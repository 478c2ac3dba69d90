//! The sampler's tests: Philox known answers, the integer exp, the CPU chain's
//! rules, and the GPU program against the CPU (same ids, same state) on lavapipe.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

fn params(temperature: f32, top_k: u32, top_p: f32, min_p: f32) -> SamplerParams {
    SamplerParams { temperature, top_k, top_p, min_p, repeat_penalty: 1.0, repeat_last_n: 64, seed: 7 }
}

/// Temperature 1, every filter off.
fn plain(seed: u64) -> SamplerParams {
    SamplerParams { seed, ..params(1.0, 0, 1.0, 0.0) }
}

/// The known-answer vectors of Random123's `kat_vectors` for philox4x32-10.
#[test]
fn philox_known_answers() {
    let kat = [
        ([0, 0, 0, 0], [0, 0], [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]),
        ([u32::MAX; 4], [u32::MAX; 2], [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]),
        ([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0], [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]),
    ];
    for (ctr, key, want) in kat {
        assert_eq!(philox4x32_10(ctr, key), want, "counter {ctr:x?} key {key:x?}");
    }
    assert_eq!(uniform(5, 3), random_bits(5, 3) as f64 / 4_294_967_296.0);
    assert!((0..1000).all(|s| (0.0..1.0).contains(&uniform(s, s as u32))));
}

#[test]
fn exp2_polynomial_is_close_to_exp2_and_weights_fall() {
    for k in 0..9 {
        let want = std::f64::consts::LN_2.powi(k) / (1..=k as u64).product::<u64>().max(1) as f64 * (1u64 << 30) as f64;
        assert_eq!(EXP2_COEFFS[k as usize], want.round() as u32, "coefficient {k}");
    }
    for f in (0..65536).step_by(7) {
        let want = (-(f as f64) / 65536.0).exp2() * 2f64.powi(31);
        let got = exp2_neg_q31(f) as f64;
        assert!((got - want).abs() / want < 2e-7, "2^(-{f}/65536): {got} vs {want}");
    }
    let s = plain(0).derived().neg_scale_p;
    assert_eq!(weight(0.0, s), Q24);
    assert_eq!(weight(-0.0, s), Q24);
    assert_eq!(weight(f32::NEG_INFINITY, s), 0);
    assert_eq!(weight(-17.0, s), 0, "e^-17 < 2^-24");
    let ln2 = std::f32::consts::LN_2;
    assert!((weight(-ln2, s) as f64 / (Q24 / 2) as f64 - 1.0).abs() < 1e-4, "{}", weight(-ln2, s));
    let mut last = Q24;
    for i in 0..2000 {
        let w = weight(-(i as f32) * 0.01, s);
        assert!(w <= last, "weights fall as the logit does");
        last = w;
    }
}

/// Every shader constant is the CPU's (the GPU tests check the bits; this one
/// needs no GPU).
#[test]
fn the_shader_writes_out_the_same_constants() {
    let src = gpu::SHADER.source;
    for c in EXP2_COEFFS {
        assert!(src.contains(&format!("{c}u")), "coefficient {c} missing from sample.wgsl");
    }
    for c in PHILOX_M.iter().chain(&PHILOX_W) {
        assert!(src.contains(&format!("0x{c:X}u")), "Philox constant {c:#X} missing from sample.wgsl");
    }
}

#[test]
fn greedy_takes_the_first_maximum() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    assert_eq!(argmax(&[f32::NAN, 1.0, 0.5]), 1, "NaN reads as -inf");
    assert_eq!(argmax(&[-0.0, 0.0]), 0, "-0 and +0 tie");
    assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
    assert_eq!(argmax(&[]), 0);
    let mut s = Sampler::new(SamplerParams::GREEDY);
    assert_eq!(s.sample(&[0.0, 5.0, 5.0]), 1);
    assert_eq!(s.state.step, 1);
}

/// The lane-wise argmax (AVX-512 where the CPU has it, and the portable lanes)
/// is the one loop's: the first of the largest, over
/// lengths around the lanes' 16, with ties, NaN, zeros of both signs and
/// subnormals, the maximum in the tail or in a lane's later chunk.
#[test]
fn greedy_lanes_give_the_one_loops_answer() {
    let one_loop = |row: &[f32]| {
        let mut best = (0u32, 0usize);
        for (i, &v) in row.iter().enumerate() {
            let k = value_key(canon(v.to_bits()));
            if k > best.0 {
                best = (k, i);
            }
        }
        best.1 as u32
    };
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let edges = [0, 1, 0x7F7F_FFFF, 0x7F80_0000, 0x7F80_0001, 0x7FC0_0000, 0x007F_FFFF, 0x0080_0000, 0xFFFF_FFFF];
    for b in edges.into_iter().chain(edges.map(|b| b | 0x8000_0000)).chain((0..100_000).map(|_| rng.random::<u32>())) {
        assert_eq!(key_of(b), value_key(canon(b)), "{b:#x}");
    }
    let specials = [f32::NAN, -0.0, 0.0, 1e-42, -1e-42, f32::NEG_INFINITY, f32::INFINITY, 2.0, 2.0];
    for case in 0..3000 {
        let n = [0, 1, 15, 16, 17, 31, 32, 33, 47, 100, 1000][case % 11];
        let mut row: Vec<f32> = (0..n).map(|_| (rng.random_range(0..6) as f32) - 3.0).collect();
        for _ in 0..rng.random_range(0..4usize) {
            if n > 0 {
                row[rng.random_range(0..n)] = specials[rng.random_range(0..specials.len())];
            }
        }
        assert_eq!(argmax(&row), one_loop(&row), "{row:?}");
        let (key, at) = argmax_lanes(&row);
        assert_eq!(merge_lanes(&row, key, at), one_loop(&row), "portable lanes: {row:?}");
    }
}

fn random_logits(rng: &mut ChaCha8Rng, v: usize, spread: f32) -> Vec<f32> {
    (0..v).map(|_| rng.random_range(-spread..spread)).collect()
}

#[test]
fn top_k_1_and_a_tiny_top_p_and_min_p_1_are_greedy() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for case in 0..200u64 {
        let logits = random_logits(&mut rng, 50, 3.0);
        let want = argmax(&logits);
        for p in [
            SamplerParams { top_k: 1, ..plain(case) },
            SamplerParams { top_p: 1e-6, ..plain(case) },
            SamplerParams { min_p: 1.0, ..plain(case) },
        ] {
            assert_eq!(Sampler::new(p).sample(&logits), want, "{p:?}");
        }
    }
}

#[test]
fn top_k_keeps_the_lower_ids_of_a_tie() {
    // ids 1, 2 and 3 tie; top-k 2 keeps ids 1 and 2 only.
    let logits = [0.0, 4.0, 4.0, 4.0, -1.0];
    let mut seen = [0usize; 5];
    for seed in 0..400 {
        seen[Sampler::new(SamplerParams { top_k: 2, ..plain(seed) }).sample(&logits) as usize] += 1;
    }
    assert_eq!((seen[0], seen[3], seen[4]), (0, 0, 0), "{seen:?}");
    assert!(seen[1] > 150 && seen[2] > 150, "{seen:?}");
}

#[test]
fn draws_follow_the_softmax_at_the_temperature() {
    // probabilities 1/7, 2/7, 4/7 at T = 1; at T = 2 proportional to 1, 1.41, 2
    let logits = [0.0, std::f32::consts::LN_2, 2.0 * std::f32::consts::LN_2];
    let n = 20_000;
    for (t, want) in [(1.0f32, [1.0 / 7.0, 2.0 / 7.0, 4.0 / 7.0]), (2.0, [0.2265, 0.3204, 0.4531])] {
        let mut counts = [0usize; 3];
        for seed in 0..n {
            counts[Sampler::new(SamplerParams { temperature: t, ..plain(seed) }).sample(&logits) as usize] += 1;
        }
        for (c, w) in counts.iter().zip(want) {
            let got = *c as f64 / n as f64;
            assert!((got - w).abs() < 0.015, "T {t}: {counts:?} vs {want:?}");
        }
    }
    // one seed, successive steps: the same distribution
    let mut s = Sampler::new(plain(3));
    let mut counts = [0usize; 3];
    for _ in 0..n {
        counts[s.sample(&logits) as usize] += 1;
    }
    assert!((counts[2] as f64 / n as f64 - 4.0 / 7.0).abs() < 0.015, "{counts:?}");
}

#[test]
fn top_p_and_min_p_drop_the_tail() {
    // p = 0.5, 0.3, 0.15, 0.05
    let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
    let ids = |p: SamplerParams| {
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..300 {
            seen.insert(Sampler::new(SamplerParams { seed, ..p }).sample(&logits));
        }
        seen.into_iter().collect::<Vec<_>>()
    };
    assert_eq!(ids(plain(0)), [0, 1, 2, 3]);
    assert_eq!(ids(SamplerParams { top_p: 0.45, ..plain(0) }), [0], "0.45 reached by the first");
    assert_eq!(ids(SamplerParams { top_p: 0.75, ..plain(0) }), [0, 1]);
    assert_eq!(ids(SamplerParams { top_p: 0.9, ..plain(0) }), [0, 1, 2]);
    assert_eq!(ids(SamplerParams { min_p: 0.2, ..plain(0) }), [0, 1, 2], "0.15 >= 0.2 * 0.5");
    assert_eq!(ids(SamplerParams { min_p: 0.5, ..plain(0) }), [0, 1]);
    assert_eq!(ids(SamplerParams { top_k: 3, min_p: 0.5, ..plain(0) }), [0, 1]);
}

#[test]
fn the_repeat_penalty_lowers_recent_ids_only() {
    let logits = [2.0, 1.9, -1.0, -1.1];
    let p = SamplerParams { repeat_penalty: 2.0, repeat_last_n: 1, ..SamplerParams::GREEDY };
    let mut s = Sampler::new(p);
    assert_eq!(s.sample(&logits), 0);
    assert_eq!(s.sample(&logits), 1, "id 0 at 2 / 2 = 1 < 1.9");
    assert_eq!(s.sample(&logits), 0, "a history of 1: only id 1 is penalized now");
    // a negative logit is multiplied
    let neg = [-1.0, -1.5];
    let mut s = Sampler::new(SamplerParams { repeat_penalty: 2.0, repeat_last_n: 4, ..SamplerParams::GREEDY });
    assert_eq!(s.sample(&neg), 0);
    assert_eq!(s.sample(&neg), 1, "-1 * 2 = -2 < -1.5");
    // an id twice in the history is penalized once: 4 / 2 = 2 > 2.5 / 2
    let mut s = Sampler::new(SamplerParams { repeat_penalty: 2.0, repeat_last_n: 4, ..SamplerParams::GREEDY });
    let ids: Vec<u32> = (0..4).map(|_| s.sample(&[4.0, 2.5, 0.0])).collect();
    assert_eq!(ids, [0, 1, 0, 0]);
    // penalty 1: no effect, no history
    let s = Sampler::new(SamplerParams::GREEDY);
    assert_eq!(s.state.words(), [0, 0, 0, 0]);
}

#[test]
fn state_words_round_trip() {
    let mut st = SamplerState::new(3);
    for id in [5, 6, 7, 8] {
        st.push(id);
    }
    assert_eq!(st.words(), [4, 3, 1, 3, 8, 6, 7]);
    assert_eq!(SamplerState::from_words(&st.words()), Some(st));
    assert_eq!(SamplerState::from_words(&[0, 4, 0, 3, 0, 0, 0]), None, "length over capacity");
    assert_eq!(SamplerState::from_words(&[0, 0]), None);
}

#[test]
fn bad_values_name_the_parameter() {
    let bad = [
        SamplerParams { temperature: -1.0, ..SamplerParams::GREEDY },
        SamplerParams { temperature: f32::NAN, ..SamplerParams::GREEDY },
        SamplerParams { top_p: 0.0, ..SamplerParams::GREEDY },
        SamplerParams { top_p: 1.5, ..SamplerParams::GREEDY },
        SamplerParams { min_p: -0.1, ..SamplerParams::GREEDY },
        SamplerParams { repeat_penalty: 0.0, ..SamplerParams::GREEDY },
        SamplerParams { repeat_last_n: MAX_REPEAT_LAST_N + 1, ..SamplerParams::GREEDY },
    ];
    let names = ["temperature", "temperature", "top_p", "top_p", "min_p", "repeat_penalty", "repeat_last_n"];
    for (p, name) in bad.iter().zip(names) {
        let e = p.validate().expect_err("out of range");
        assert!(matches!(e, SampleError::Param { name: n, .. } if n == name), "{e}");
    }
    assert!(SamplerParams::GREEDY.validate().is_ok());
}

// ---- the GPU program against the CPU ----

/// The shader's primitives equal the CPU's on many inputs (edge values first).
#[test]
fn gpu_primitives_match_the_cpu() {
    let Some(gpu) = crate::testing::test_gpu() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut inputs: Vec<u32> = vec![0, 1, u32::MAX, 0xFFFF, 0x10000, 0x8000_0000, 0x7F80_0000, 0xFF80_0000, 0x7FC0_0000, 1.0f32.to_bits()];
    inputs.extend((0..2000).map(|_| rng.random::<u32>()));
    // small floats: the weights' working range
    inputs.extend((0..2000).map(|_| rng.random_range(-30.0f32..30.0).to_bits()));
    let p = SamplerParams { temperature: 0.7, ..plain(0) };
    let seed = 0x1234_5678_9abc_def0;
    let got = gpu::probe(&gpu, &inputs, seed, &p).expect("probe runs");
    let d = p.derived();
    for (i, &x) in inputs.iter().enumerate() {
        let y = inputs[(i + 1) % inputs.len()];
        let r = philox4x32_10([x, i as u32, y, !x], [seed as u32, (seed >> 32) as u32]);
        let (hi, lo) = mulhilo(x, y);
        let dx = -canon(x).abs();
        let want = [r[0], r[1], r[2], r[3], hi, lo, weight(dx, d.neg_scale_p), weight(dx, d.neg_scale_t)];
        assert_eq!(&got[8 * i..8 * i + 8], &want, "input {i}: {x:#x}");
    }
}

/// Logits of a kind: random, with ties, peaked, flat.
fn logits_of(kind: &str, v: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    match kind {
        "random" => random_logits(rng, v, 8.0),
        // a few distinct values, many ties
        "ties" => (0..v).map(|_| rng.random_range(0..4) as f32 * 0.5).collect(),
        "peaked" => {
            let mut l = random_logits(rng, v, 1.0);
            l[rng.random_range(0..v)] = 25.0;
            l[rng.random_range(0..v)] = 24.0;
            l
        }
        _ => (0..v).map(|i| 1e-3 * (i % 5) as f32 + rng.random_range(-1e-6f32..1e-6)).collect(),
    }
}

/// The GPU program returns the CPU's id at every step, and leaves the same state.
#[test]
fn gpu_sampler_matches_the_cpu() {
    let Some(gpu) = crate::testing::test_gpu() else { return };
    let sets = [
        SamplerParams::GREEDY,
        SamplerParams { repeat_penalty: 1.5, repeat_last_n: 4, ..SamplerParams::GREEDY },
        plain(1),
        SamplerParams { seed: 42, ..params(0.8, 40, 0.95, 0.05) },
        SamplerParams { repeat_penalty: 1.3, repeat_last_n: 8, seed: 9, ..params(1.5, 0, 0.5, 0.0) },
        SamplerParams { seed: u64::MAX, ..params(0.7, 3, 1.0, 0.1) },
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    // (vocab, kinds, parameter sets, steps): the large vocabularies a few times
    let plan: [(usize, &[&str], &[usize], u32); 4] = [
        (1, &["random", "flat"], &[0, 1, 2, 3, 4, 5], 3),
        (7, &["random", "ties", "peaked", "flat"], &[0, 1, 2, 3, 4, 5], 4),
        (49152, &["random", "ties", "peaked", "flat"], &[2, 3, 4, 5], 2),
        (262144, &["random", "ties"], &[1, 3, 4], 1),
    ];
    let mut runs = 0;
    for (v, kinds, which, steps) in plan {
        for kind in kinds {
            let logits = logits_of(kind, v, &mut rng);
            let buf = gpu.upload("logits", bytemuck::cast_slice(&logits));
            for &w in which {
                let p = sets[w];
                let s = gpu::GpuSampler::new(&gpu, &buf, v, &p).expect("program builds");
                // two generations on one program: the restart rewinds the step and the history
                for _ in 0..2 {
                    s.restart(&gpu);
                    let mut cpu = Sampler::new(p);
                    for step in 0..steps {
                        gpu.run("sample", &[&s.program]).expect("runs");
                        let want = cpu.sample(&logits);
                        assert_eq!(s.read_id(&gpu).expect("reads"), want, "vocab {v}, {kind} logits, {p:?}, step {step}");
                        runs += 1;
                    }
                    assert_eq!(gpu::read_state(&gpu, &s.state).expect("state"), cpu.state, "vocab {v}, {kind}, {p:?}");
                }
            }
        }
    }
    assert!(runs > 200, "{runs} draws compared");
}

#[test]
fn gpu_program_refuses_short_buffers() {
    let Some(gpu) = crate::testing::test_gpu() else { return };
    let p = SamplerParams { repeat_penalty: 1.1, ..SamplerParams::GREEDY };
    let logits = gpu.storage("logits", 64);
    let out = gpu.storage("id", 4);
    let short_state = gpu.storage("state", 16);
    let e = gpu::prepare_wgsl(&gpu, &logits, 16, &p, &short_state, &out).err().expect("refused");
    assert!(e.to_string().contains("state buffer"), "{e}");
    let state = gpu::state_buffer(&gpu, &SamplerState::new(p.derived().last_n));
    let e = gpu::prepare_wgsl(&gpu, &logits, 1000, &p, &state, &out).err().expect("refused");
    assert!(e.to_string().contains("logits buffer"), "{e}");
}
