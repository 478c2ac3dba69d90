//! libFuzzer target: `ktune::fuzzing::logits`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ktune::fuzzing::logits(data);
});
