//! The fuzz targets' smoke run on the stable toolchain: every target of
//! `ktune::fuzzing` over its committed seeds (`fuzz/seeds/T/`) and regression
//! inputs (`fuzz/regressions/T/`: each a crash, OOM or timeout the long
//! libFuzzer runs found, fixed since), then over a fixed-seed, bounded set of
//! mutations of them (bit flips, truncations, splices of another input,
//! length-sized fields overwritten with boundary values). A panic fails the
//! test; so does a seed its target rejects (a seed must reach past the reader's
//! first check, or it seeds nothing). The coverage-guided runs are
//! `tools/fuzz.sh` (docs/fuzzing.md).

use std::path::{Path, PathBuf};

use ktune::fuzzing::TARGETS;

/// Mutated inputs per seed file.
const MUTATIONS: usize = 256;

fn inputs(kind: &str, target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz").join(kind).join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut out: Vec<(PathBuf, Vec<u8>)> = entries
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, bytes)
        })
        .collect();
    out.sort();
    out
}

/// xorshift64*: the mutations are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One to four changes to `seed`; `other` is another input of the same target
/// (spliced in).
fn mutate(rng: &mut Rng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        if v.is_empty() {
            break;
        }
        // Half the changes land in the first 512 bytes, where headers keep their counts and lengths.
        let at = if rng.below(2) == 0 { rng.below(v.len().min(512)) } else { rng.below(v.len()) };
        match rng.below(8) {
            0..=2 => v[at] ^= 1 << rng.below(8),
            3 => v.truncate(at),
            4 | 5 => {
                let from = rng.below(other.len());
                let len = rng.below(64).min(other.len() - from.min(other.len()));
                v.splice(at..at, other[from..from + len].iter().copied());
            }
            _ => {
                let boundary = [0, 1, u64::MAX, 1 << 63, u32::MAX as u64, seed.len() as u64, rng.next()];
                let bytes = boundary[rng.below(boundary.len())].to_le_bytes();
                let end = (at + [2, 4, 8][rng.below(3)]).min(v.len());
                v[at..end].copy_from_slice(&bytes[..end - at]);
            }
        }
    }
    v
}

#[test]
fn every_fuzz_target_survives_its_seeds_regressions_and_their_mutations() {
    let mut rng = Rng(0x6b74_756e_6566_757a);
    for &(name, target) in TARGETS {
        let seeds = inputs("seeds", name);
        assert!(!seeds.is_empty(), "fuzz/seeds/{name}/ is empty: run tools/fuzz.sh seeds");
        for (path, bytes) in &seeds {
            let stage = target(bytes);
            assert_ne!(stage, "rejected", "{}: the seed is rejected by its target", path.display());
        }
        let regressions = inputs("regressions", name);
        for (_, bytes) in &regressions {
            target(bytes);
        }
        let all: Vec<&[u8]> = seeds.iter().chain(&regressions).map(|(_, b)| b.as_slice()).collect();
        let mut stages = std::collections::BTreeMap::<&str, usize>::new();
        for seed in &all {
            for _ in 0..MUTATIONS {
                let other = all[rng.below(all.len())];
                *stages.entry(target(&mutate(&mut rng, seed, other))).or_default() += 1;
            }
        }
        eprintln!(
            "{name}: {} seeds, {} regressions, {} mutations reached {stages:?}",
            seeds.len(),
            regressions.len(),
            all.len() * MUTATIONS
        );
    }
}
