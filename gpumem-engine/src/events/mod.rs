//! Events from the kernel, as the engine takes them: ring-buffer records
//! decoded into events and stacks (any bytes accepted, nothing misread),
//! and each event typed by what it is (`Kind`). Reading the rings is the
//! agent's (probes::reader); what was lost is counted in `model::lost`.
pub mod decode;
pub mod kind;

pub use decode::{decode_event, decode_stack, stack_buffer, stack_key, StackKey};
pub use kind::Kind;
