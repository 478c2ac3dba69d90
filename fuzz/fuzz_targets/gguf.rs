//! libFuzzer target: `ktune::fuzzing::gguf`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ktune::fuzzing::gguf(data);
});
