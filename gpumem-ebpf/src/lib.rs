// Present so that gpumem-agent can name this crate as a build-dependency
// (aya-template layout); the programs live in the `gpumem` binary target.
#![no_std]
