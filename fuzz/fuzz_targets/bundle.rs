//! libFuzzer target: `ktune::fuzzing::bundle`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ktune::fuzzing::bundle(data);
});
