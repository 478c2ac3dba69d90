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

/// Resident set size of this process, KiB.
fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).expect("resident pages") * 4
}

/// Run alone by [`repeated_inputs_keep_memory_flat`] in a process of its own
/// (`--ignored --exact`): the growth of the resident set over 1000 runs of the
/// tokenizer and gguf targets on one seed each, after 100 to warm up.
#[test]
#[ignore = "run by repeated_inputs_keep_memory_flat in a child process"]
fn memory_growth_probe() {
    let seed = |t: &str, f: &str| std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds").join(t).join(f)).expect("seed");
    let (tok, model) = (seed("tokenizer", "llama.gguf"), seed("gguf", "tiny-smollm.gguf"));
    let run = |n: usize| {
        for _ in 0..n {
            ktune::fuzzing::tokenizer(&tok);
            ktune::fuzzing::gguf(&model);
        }
    };
    run(100);
    let before = rss_kib();
    run(1000);
    println!("GROWTH_KIB {}", rss_kib().saturating_sub(before));
}

/// The fuzz targets' memory stays flat over repeated inputs: the `tokenizers`
/// crate keeps a per-thread word cache for each BPE tokenizer it ever encoded
/// with and never drops it, and the long libFuzzer run of the tokenizer target
/// stopped out of memory (2 GB) after 3.8M inputs; the targets now encode on a
/// thread of their own (`ktune::fuzzing`). 3000 runs grew the process by ~12 MB
/// before (~4 KB a run: 1000 runs, what the probe runs, would grow it by ~4 MB),
/// and stay under 2 MB now. Measured in a child process running only the
/// probe, so no other test's memory counts.
#[test]
fn repeated_inputs_keep_memory_flat() {
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--ignored", "--exact", "fuzz_smoke::memory_growth_probe", "--nocapture", "--test-threads=1"])
        .output()
        .expect("the probe runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "probe failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let kib: u64 = stdout
        .lines()
        .find_map(|l| l.split("GROWTH_KIB ").nth(1))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no GROWTH_KIB line:\n{stdout}"));
    assert!(kib < 2048, "1000 runs of the tokenizer and gguf targets grew the process by {kib} KiB");
}
