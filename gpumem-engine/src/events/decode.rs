//! Ring-buffer records into events and stacks: any bytes are accepted, and
//! a record that cannot hold what it claims is reported as such, never misread.
use gpumem_common::{
    python::{PY_FRAMES_MAX, PY_FRAME_SIZE},
    Event, StackEvent, STACK_EVENT_SIZE, STACK_HEADER_SIZE,
};

/// One record of the event ring; None if shorter than an Event (an ABI
/// mismatch): nothing can be read from it.
pub fn decode_event(item: &[u8]) -> Option<Event> {
    Event::from_bytes(item)
}

/// Which event a stack-ring record belongs to: its thread and timestamp.
pub type StackKey = (u32, u64);

/// The event a stack-ring record belongs to, without copying the stack;
/// None if the record is shorter than a stack header.
pub fn stack_key(item: &[u8]) -> Option<StackKey> {
    if item.len() < STACK_HEADER_SIZE {
        return None;
    }
    let ev = Event::from_bytes(item)?;
    Some((ev.tid, ev.ts_ns))
}

/// Copies one stack-ring record into `buf` (only the bytes the record holds,
/// the Python frame count and the stack length clamped to them); None if it
/// is shorter than a stack header.
pub fn decode_stack(item: &[u8], buf: &mut StackEvent) -> Option<StackKey> {
    let key = stack_key(item)?;
    // Header plus only the frames and stack bytes that were copied.
    let n = item.len().min(STACK_EVENT_SIZE);
    // SAFETY: n fits both the record and the buffer; StackEvent is plain old data.
    unsafe { std::ptr::copy_nonoverlapping(item.as_ptr(), (buf as *mut StackEvent).cast::<u8>(), n) };
    let data = n - STACK_HEADER_SIZE;
    buf.py_frames = buf.py_frames.min(PY_FRAMES_MAX as u32).min((data / PY_FRAME_SIZE) as u32);
    buf.len = buf.len.min((data - buf.py_frames as usize * PY_FRAME_SIZE) as u32);
    Some(key)
}

/// A zeroed stack record, boxed (8 KiB: not for the stack).
pub fn stack_buffer() -> Box<StackEvent> {
    // SAFETY: StackEvent is plain old data; all zeroes is a valid value.
    unsafe { Box::<StackEvent>::new_zeroed().assume_init() }
}
