//! libFuzzer target: `ktune::fuzzing::cli`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ktune::fuzzing::cli(data);
});
