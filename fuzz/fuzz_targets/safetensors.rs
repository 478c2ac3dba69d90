//! libFuzzer target: `ktune::fuzzing::safetensors`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ktune::fuzzing::safetensors(data);
});
