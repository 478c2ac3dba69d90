//! Fuzzing the readers of untrusted files with proptest: GGUF (header, metadata,
//! tensor infos, then the model config, every tensor read as f32, quantized
//! loads and the tokenizer; a vision projector file paired with a text model, its
//! tower run), safetensors (header, then every tensor read),
//! profiles (YAML, then validation) and `eval`'s saved logits files (header,
//! token ids, rows). Inputs are valid files mutated: bit flips,
//! truncations, inserted and deleted bytes, and length/count/offset fields
//! overwritten with boundary values, biased towards the header where the
//! lengths live. The targets are `ktune::fuzzing`'s (the libFuzzer targets of
//! `fuzz/` run the same functions), but for the projector pipeline.
//!
//! Every reader must return (Ok or an error), never panic, and never make a
//! single allocation larger than the input justifies (a counting global
//! allocator checks the largest request of each case against 64 x the input
//! size + 1 MiB).
//!
//! Quick by default (proptest's 256 cases per target); a long run:
//! `PROPTEST_CASES=200000 cargo test --release --test fuzz_readers -- --nocapture`.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;
use std::time::Instant;

use common::fixture;
use ktune::model::gguf::GgufFile;
use ktune::model::{WeightFile, Weights, mmproj};
use ktune::runtime::vision::VisionEngine;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// The system allocator, remembering the largest single request of each thread
/// (the test threads run in parallel; the big buffers are allocated by the thread
/// that reads, rayon's workers only fill them).
struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // try_with: nothing to record while the thread's locals are being torn down.
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// One change to a file.
#[derive(Clone, Debug)]
enum Mutation {
    Flip {
        pos: Pos,
        bit: u8,
    },
    Truncate {
        pos: Pos,
    },
    Insert {
        pos: Pos,
        bytes: Vec<u8>,
    },
    Delete {
        pos: Pos,
        len: usize,
    },
    /// A little-endian field of `width` bytes overwritten.
    Field {
        pos: Pos,
        width: usize,
        value: Boundary,
    },
}

/// A position: anywhere, or inside the header (where the lengths and offsets are).
#[derive(Clone, Debug)]
struct Pos {
    header: bool,
    at: usize,
}

#[derive(Clone, Debug)]
enum Boundary {
    Zero,
    One,
    Max,
    SignBit,
    U32Max,
    /// The file's length (plus a small amount).
    Len(u8),
    Any(u64),
}

fn pos() -> impl Strategy<Value = Pos> {
    (prop::bool::weighted(0.6), any::<usize>()).prop_map(|(header, at)| Pos { header, at })
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let boundary = prop_oneof![
        Just(Boundary::Zero),
        Just(Boundary::One),
        Just(Boundary::Max),
        Just(Boundary::SignBit),
        Just(Boundary::U32Max),
        any::<u8>().prop_map(Boundary::Len),
        any::<u64>().prop_map(Boundary::Any),
    ];
    prop_oneof![
        3 => (pos(), 0u8..8).prop_map(|(pos, bit)| Mutation::Flip { pos, bit }),
        1 => pos().prop_map(|pos| Mutation::Truncate { pos }),
        1 => (pos(), prop::collection::vec(any::<u8>(), 1..16)).prop_map(|(pos, bytes)| Mutation::Insert { pos, bytes }),
        1 => (pos(), 1usize..16).prop_map(|(pos, len)| Mutation::Delete { pos, len }),
        3 => (pos(), prop_oneof![Just(4usize), Just(8usize)], boundary).prop_map(|(pos, width, value)| Mutation::Field { pos, width, value }),
    ]
}

/// Applies `muts` to `seed`, whose first `header` bytes hold its lengths and offsets.
fn mutate(seed: &[u8], header: usize, muts: &[Mutation]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for m in muts {
        if v.is_empty() {
            break;
        }
        let at = |p: &Pos, len: usize| if p.header { p.at % header.clamp(1, len) } else { p.at % len };
        match m {
            Mutation::Flip { pos, bit } => {
                let i = at(pos, v.len());
                v[i] ^= 1 << bit;
            }
            Mutation::Truncate { pos } => {
                let i = at(pos, v.len());
                v.truncate(i);
            }
            Mutation::Insert { pos, bytes } => {
                let i = at(pos, v.len());
                v.splice(i..i, bytes.iter().copied());
            }
            Mutation::Delete { pos, len } => {
                let i = at(pos, v.len());
                let end = (i + len).min(v.len());
                v.drain(i..end);
            }
            Mutation::Field { pos, width, value } => {
                let i = at(pos, v.len());
                let n = v.len() as u64;
                let x = match value {
                    Boundary::Zero => 0,
                    Boundary::One => 1,
                    Boundary::Max => u64::MAX,
                    Boundary::SignBit => 1 << 63,
                    Boundary::U32Max => u32::MAX as u64,
                    Boundary::Len(d) => n + *d as u64,
                    Boundary::Any(x) => *x,
                };
                let bytes = x.to_le_bytes();
                let end = (i + width).min(v.len());
                v[i..end].copy_from_slice(&bytes[..end - i]);
            }
        }
    }
    v
}

/// Runs `target` on mutations of `seed` (it returns how far the input got: an
/// error's stage, or "ok"); returns how many cases ran.
fn fuzz(what: &str, seed: Vec<u8>, header: usize, target: impl Fn(Vec<u8>) -> &'static str) -> u32 {
    let stages = std::cell::RefCell::new(std::collections::BTreeMap::<&'static str, u32>::new());
    let mut runner = TestRunner::new(Config { failure_persistence: None, ..Config::default() });
    let cases = runner.config().cases;
    let start = Instant::now();
    let strategy = prop::collection::vec(mutation(), 1..5);
    let result = runner.run(&strategy, |muts| {
        let input = mutate(&seed, header, &muts);
        let budget = 64 * input.len() + (1 << 20);
        LARGEST.with(|l| l.set(0));
        *stages.borrow_mut().entry(target(input)).or_default() += 1;
        let largest = LARGEST.with(Cell::get);
        if largest > budget {
            return Err(TestCaseError::fail(format!("{what}: one allocation of {largest} bytes for a {}-byte input", budget - (1 << 20))));
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{what}: {e}");
    }
    eprintln!(
        "{what}: {cases} mutated inputs in {:.1} s, no panic, no oversized allocation; reached: {:?}",
        start.elapsed().as_secs_f64(),
        stages.borrow()
    );
    cases
}

/// Where the tensor data of a GGUF seed starts (everything before is header).
fn gguf_header_len(seed: &[u8]) -> usize {
    let m = Weights::gguf_from_bytes(Path::new("seed.gguf"), seed.to_vec()).expect("the seed is valid");
    m.file.tensors.iter().map(|t| t.start).min().unwrap_or(seed.len())
}

#[test]
fn fuzz_gguf_reader() {
    // The smallest fixtures: a quantized llama with a tokenizer, and qwen2 (biases, untied head).
    for file in ["gguf/smollm2-tiny-q4_0.gguf", "gguf/qwen2-tiny-q8_0.gguf"] {
        let seed = std::fs::read(fixture(file)).expect("fixture");
        let header = gguf_header_len(&seed);
        fuzz(file, seed, header, |b| ktune::fuzzing::gguf(&b));
    }
}

/// The vision projector pipeline of `ktune run --gguf --mmproj` on a mutated
/// mmproj image in memory, paired with the fixture's text model: metadata into a
/// vision config, tensors added under the canonical names, checked, and the tower
/// run on a blank image when they match.
fn mmproj_target(text: &[u8], bytes: Vec<u8>) -> &'static str {
    let Ok(file) = GgufFile::parse(Path::new("fuzz-mmproj.gguf"), bytes) else { return "rejected" };
    let mut m = Weights::gguf_from_bytes(Path::new("text.gguf"), text.to_vec()).expect("the text model");
    let vocab = m.file.get("tokenizer.ggml.tokens").and_then(|v| v.as_array());
    let Ok(v) = mmproj::mmproj_config(&file, &m.config, Path::new("text.gguf"), vocab) else { return "parsed, config refused" };
    if m.weights.add_gguf(std::sync::Arc::new(file), mmproj::mmproj_name).is_err() || m.weights.check_vision(&v).is_err() {
        return "config read, tensors do not match it";
    }
    let pixels = vec![0f32; v.num_channels * v.image_size * v.image_size];
    match VisionEngine::new(&v, &m.weights).and_then(|t| t.encode(&pixels)) {
        Ok(_) => "tower ran",
        Err(_) => "tower refused",
    }
}

#[test]
fn fuzz_mmproj_reader() {
    let text = std::fs::read(fixture("gemma3-vision-gguf/text.gguf")).expect("fixture");
    let seed = std::fs::read(fixture("gemma3-vision-gguf/mmproj.gguf")).expect("fixture");
    let header = gguf_header_len_of(&seed);
    fuzz("gemma3-vision-gguf/mmproj.gguf", seed, header, |b| mmproj_target(&text, b));
}

/// Where the tensor data of any GGUF seed starts (a projector has no model config).
fn gguf_header_len_of(seed: &[u8]) -> usize {
    let f = GgufFile::parse(Path::new("seed.gguf"), seed.to_vec()).expect("the seed is valid");
    f.tensors.iter().map(|t| t.start).min().unwrap_or(seed.len())
}

#[test]
fn fuzz_safetensors_reader() {
    let seed = std::fs::read(fixture("qwen2-tiny-sharded/model-00004-of-00004.safetensors")).expect("fixture");
    let header = 8 + u64::from_le_bytes(seed[..8].try_into().expect("8 bytes")) as usize;
    // The target reads a config.json, NUL, then the file: no config here.
    fuzz("safetensors", seed, header, |bytes| ktune::fuzzing::safetensors(&[b"\0", bytes.as_slice()].concat()));
}

#[test]
fn fuzz_vocabulary_reader() {
    // Tokenizer-only files: every byte is header.
    for file in ["spm/gemma3.gguf", "spm/llama.gguf"] {
        let seed = std::fs::read(fixture(file)).expect("fixture");
        let header = seed.len();
        fuzz(file, seed, header, |b| ktune::fuzzing::tokenizer(&[b"Hi there\0", b.as_slice()].concat()));
    }
}

#[test]
fn fuzz_profile_reader() {
    let seed = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/llama-3.2-1b-cpu-epyc-2core.yaml")).expect("profile");
    let header = seed.len();
    fuzz("profile", seed, header, |b| ktune::fuzzing::profile(&b));
}

#[test]
fn fuzz_logits_reader() {
    // `eval --save-logits`'s format: the sizes live in the 40-byte header.
    let seed = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/logits/f32-2chunks.bin")).expect("seed");
    fuzz("logits", seed, 40, |b| ktune::fuzzing::logits(&b));
}

/// Regression (found by fuzz_gguf_reader with 200000 cases): one bit flipped in
/// `llama.block_count` (3 -> 65539) made the config check list 655 390 missing
/// tensors, a 48 MiB allocation for an 80 KB file.
#[test]
fn absurd_block_count_is_an_error_not_a_big_table() {
    let mut seed = std::fs::read(fixture("gguf/smollm2-tiny-q4_0.gguf")).expect("fixture");
    let key = b"llama.block_count";
    let at = seed.windows(key.len()).position(|w| w == key).expect("key") + key.len() + 4;
    seed[at + 2] ^= 1;
    LARGEST.with(|l| l.set(0));
    let e = Weights::gguf_from_bytes(Path::new("flip.gguf"), seed).expect_err("corrupt").to_string();
    assert!(e.contains("`llama.block_count` is 65539"), "{e}");
    assert!(LARGEST.with(Cell::get) < 1 << 20);
}
