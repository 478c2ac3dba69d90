//! libFuzzer target: `ktune::fuzzing::tokenizer`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ktune::fuzzing::tokenizer(data);
});
