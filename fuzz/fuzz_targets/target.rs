//! Every fuzz target: the binary's name picks the parser
//! (gpumem_engine::untrusted::TARGETS).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    assert!(gpumem_engine::untrusted::run(env!("CARGO_BIN_NAME"), data), "no target named {}", env!("CARGO_BIN_NAME"));
});
