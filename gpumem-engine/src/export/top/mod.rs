//! `gpumem top`'s outputs: the model (what is shown, as text for `--once`)
//! and the terminal UI that draws it.
pub mod model;
pub mod panes;
pub mod tui;

pub use model::{build, device_name, Kept, Snapshot, SortKey};
