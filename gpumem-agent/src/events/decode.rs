//! Ring-buffer records into events: any bytes are accepted, and a record
//! that cannot hold what it claims is reported as such, never misread.
use gpumem_common::{flags, Event, StackEvent, STACK_EVENT_SIZE, STACK_HEADER_SIZE};

/// One ring-buffer record, decoded.
#[derive(Debug)]
pub enum Decoded {
    /// Shorter than an Event (an ABI mismatch): nothing can be read from it.
    Malformed,
    Event(Event),
    /// An event whose stack was copied into the caller's buffer.
    WithStack(Event),
    /// An event flagged with a stack whose record is too short to hold one.
    StackMissing(Event),
}

/// Decodes one record; a stack goes into `buf` (only the bytes the record
/// holds, its length clamped to them).
pub fn decode(item: &[u8], buf: &mut StackEvent) -> Decoded {
    let Some(ev) = Event::from_bytes(item) else { return Decoded::Malformed };
    if ev.flags & flags::HAS_STACK == 0 {
        return Decoded::Event(ev);
    }
    if item.len() < STACK_HEADER_SIZE {
        return Decoded::StackMissing(ev);
    }
    // Header plus only the stack bytes that were copied.
    let n = item.len().min(STACK_EVENT_SIZE);
    // SAFETY: n fits both the record and the buffer; StackEvent is plain old data.
    unsafe { std::ptr::copy_nonoverlapping(item.as_ptr(), (buf as *mut StackEvent).cast::<u8>(), n) };
    buf.len = buf.len.min((n - STACK_HEADER_SIZE) as u32);
    Decoded::WithStack(ev)
}

/// A zeroed stack record, boxed (8 KiB: not for the stack).
pub fn stack_buffer() -> Box<StackEvent> {
    // SAFETY: StackEvent is plain old data; all zeroes is a valid value.
    unsafe { Box::<StackEvent>::new_zeroed().assume_init() }
}
