//! libFuzzer target: `ktune::fuzzing::profile`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ktune::fuzzing::profile(data);
});
