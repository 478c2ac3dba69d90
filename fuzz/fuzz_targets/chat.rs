//! libFuzzer target: `ktune::fuzzing::chat`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ktune::fuzzing::chat(data);
});
