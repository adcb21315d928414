//! What each kind of event carries in `Event`'s general fields (`addr`,
//! `size`, `handle`, `aux`), written once: the eBPF programs `pack` a
//! payload into the event they send, the agent `unpack`s it from the event
//! it reads, and a property test checks that the two are inverse and that
//! packing touches nothing else. Identity fields (`pid`, `tid`, `api`,
//! `result`, `device`, `flags`, `comm`, times) are the event's own.
use crate::Event;

/// A payload: which of the event's general fields hold what.
pub trait Payload: Sized {
    /// Writes the payload into the event's general fields.
    fn pack(&self, ev: &mut Event);
    /// Reads it back.
    fn unpack(ev: &Event) -> Self;
}

#[inline(always)]
const fn low(v: u64) -> u32 {
    v as u32
}

#[inline(always)]
const fn high(v: u64) -> u32 {
    (v >> 32) as u32
}

#[inline(always)]
const fn join(low: u32, high: u32) -> u64 {
    low as u64 | ((high as u64) << 32)
}

macro_rules! plain_payload {
    ($(#[$doc:meta])* $name:ident { $($field:ident => $slot:ident),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name {
            $(pub $field: u64,)*
        }

        impl Payload for $name {
            #[inline(always)]
            fn pack(&self, ev: &mut Event) {
                $(ev.$slot = self.$field;)*
            }

            #[inline(always)]
            fn unpack(ev: &Event) -> Self {
                $name { $($field: ev.$slot,)* }
            }
        }
    };
}

plain_payload! {
    /// An allocation (device, managed, async, pool, pinned host): the
    /// pointer returned and its bytes.
    Alloc { addr => addr, size => size }
}

plain_payload! {
    /// cuMemAllocPitch_v2: the pointer, pitch × height bytes, the pitch.
    PitchAlloc { addr => addr, size => size, pitch => aux }
}

plain_payload! {
    /// cuMemAllocFromPoolAsync(_ptsz): the pointer, its bytes and the pool.
    PoolAlloc { addr => addr, size => size, pool => handle }
}

plain_payload! {
    /// An export or import of a shared allocation (cuIpc*, cuMemPool*Pointer):
    /// the pointer, the key of the bytes that travel between the processes
    /// (`ipc::key`; 0 where they could not be read) and, for a pool import,
    /// the pool.
    Shared { addr => addr, key => handle, pool => aux }
}

plain_payload! {
    /// A stream-ordered pool call: the pool and, for a trim, the bytes kept.
    Pool { pool => handle, keep => size }
}

plain_payload! {
    /// cuCtxFromGreenCtx: the context and the green context it stands for
    /// (cuGreenCtxCreate/Destroy: the green context in `ctx`).
    GreenCtx { ctx => handle, green => aux }
}

plain_payload! {
    /// A CUDA graph's memory node (cuGraphAddMemAllocNode/FreeNode) or the
    /// graph itself (cuGraphDestroy): the pointer, its bytes, the graph.
    GraphNode { addr => addr, size => size, graph => handle }
}

plain_payload! {
    /// cuCheckpointProcess*: the process acted on (its pid).
    CheckpointCall { target => addr }
}

plain_payload! {
    /// A multicast call: the object, the bytes, the offset in it and the
    /// memory bound (a physical handle, or an address).
    MulticastCall { mc => handle, size => size, offset => aux, memory => addr }
}

plain_payload! {
    /// A shareable handle exported, imported or retained: the physical
    /// handle, the key of what travels between the processes (0: none),
    /// the handle type (an address for a retain).
    ShareableHandle { handle => handle, key => addr, kind => aux }
}

plain_payload! {
    /// cuDeviceGetUuid_v2: the 16 bytes of the UUID, as two words in memory order.
    DeviceUuid { first => addr, last => aux }
}

plain_payload! {
    /// A free: the pointer freed.
    Free { addr => addr }
}

plain_payload! {
    /// cuMemCreate: the handle of the physical memory and its bytes.
    VmmCreate { handle => handle, size => size }
}

plain_payload! {
    /// cuMemRelease: the handle.
    VmmRelease { handle => handle }
}

plain_payload! {
    /// cuMemMap: a range bound to `offset` into a handle.
    VmmMap { addr => addr, size => size, offset => aux, handle => handle }
}

plain_payload! {
    /// cuMemUnmap, cuMemAddressReserve, cuMemAddressFree: an address range.
    VaRange { addr => addr, size => size }
}

plain_payload! {
    /// A context call: the CUcontext.
    Context { handle => handle }
}

plain_payload! {
    /// cuMemGetInfo_v2: the free and total bytes the driver reported.
    MemInfo { free => size, total => aux }
}

plain_payload! {
    /// cuInit: its flags.
    Init { flags => aux }
}

plain_payload! {
    /// oom:mark_victim's figures, in KiB as the kernel gives them (the
    /// event's `pid` is the victim, its `tid` the task that triggered the kill).
    OomFigures { total_vm_kib => addr, anon_rss_kib => size, file_rss_kib => handle, shmem_rss_kib => aux }
}

plain_payload! {
    /// NV_ESC_RM_MAP_MEMORY(_DMA): the memory object, the length mapped and
    /// the (linear or DMA) address returned.
    RmMap { memory => handle, length => size, address => addr }
}

plain_payload! {
    /// UVM_MAP_EXTERNAL_ALLOCATION, UVM_FREE: the range.
    UvmRange { base => addr, length => size }
}

plain_payload! {
    /// `pytorch:malloc`: the tensor's block, the bytes asked and the stream
    /// (the device is the event's).
    TensorAlloc { addr => addr, size => size, stream => aux }
}

plain_payload! {
    /// `pytorch:free`: the block given back.
    TensorFree { addr => addr }
}

/// NV_ESC_RM_ALLOC: RM handles are 32 bits, so parent and root share `addr`
/// and the class shares `aux` with the memory flags; `size` is the size
/// asked for video memory (class 0x40).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RmAlloc {
    pub object: u32,
    pub parent: u32,
    pub root: u32,
    pub class: u32,
    pub flags: u32,
    pub size: u64,
}

impl Payload for RmAlloc {
    #[inline(always)]
    fn pack(&self, ev: &mut Event) {
        ev.handle = self.object as u64;
        ev.addr = join(self.parent, self.root);
        ev.aux = join(self.class, self.flags);
        ev.size = self.size;
    }

    #[inline(always)]
    fn unpack(ev: &Event) -> Self {
        RmAlloc {
            object: low(ev.handle),
            parent: low(ev.addr),
            root: high(ev.addr),
            class: low(ev.aux),
            flags: high(ev.aux),
            size: ev.size,
        }
    }
}

/// NV_ESC_RM_FREE: the object freed (and everything under it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RmFree {
    pub object: u32,
    pub parent: u32,
    pub root: u32,
}

impl Payload for RmFree {
    #[inline(always)]
    fn pack(&self, ev: &mut Event) {
        ev.handle = self.object as u64;
        ev.addr = join(self.parent, self.root);
    }

    #[inline(always)]
    fn unpack(ev: &Event) -> Self {
        RmFree { object: low(ev.handle), parent: low(ev.addr), root: high(ev.addr) }
    }
}

/// NV_ESC_RM_CONTROL: the object and the control command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RmControl {
    pub object: u32,
    pub cmd: u64,
}

impl Payload for RmControl {
    #[inline(always)]
    fn pack(&self, ev: &mut Event) {
        ev.handle = self.object as u64;
        ev.aux = self.cmd;
    }

    #[inline(always)]
    fn unpack(ev: &Event) -> Self {
        RmControl { object: low(ev.handle), cmd: ev.aux }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use proptest::prelude::*;

    use super::*;
    use crate::COMM_LEN;

    /// Any event: what a payload is packed into.
    fn any_event() -> impl Strategy<Value = Event> {
        (any::<[u64; 6]>(), any::<[u32; 4]>(), any::<i32>(), any::<u32>(), any::<[u8; COMM_LEN]>()).prop_map(
            |(w, h, device, flags, comm)| Event {
                ts_ns: w[0],
                latency_ns: w[1],
                addr: w[2],
                size: w[3],
                handle: w[4],
                aux: w[5],
                pid: h[0],
                tid: h[1],
                api: h[2],
                result: h[3],
                device,
                flags,
                comm,
            },
        )
    }

    /// Packing then unpacking gives the payload back, and leaves the
    /// event's identity (everything but the general fields) as it was.
    fn round_trips<P: Payload + PartialEq + core::fmt::Debug>(p: P, mut ev: Event) -> Result<(), TestCaseError> {
        let before = ev;
        p.pack(&mut ev);
        prop_assert_eq!(P::unpack(&ev), p);
        let identity = |e: &Event| (e.ts_ns, e.latency_ns, e.pid, e.tid, e.api, e.result, e.device, e.flags, e.comm);
        prop_assert_eq!(identity(&ev), identity(&before));
        Ok(())
    }

    proptest! {
        #[test]
        fn every_payload_round_trips(w in any::<[u64; 4]>(), h in any::<[u32; 5]>(), ev in any_event()) {
            round_trips(Alloc { addr: w[0], size: w[1] }, ev)?;
            round_trips(PitchAlloc { addr: w[0], size: w[1], pitch: w[2] }, ev)?;
            round_trips(Free { addr: w[0] }, ev)?;
            round_trips(PoolAlloc { addr: w[0], size: w[1], pool: w[2] }, ev)?;
            round_trips(Shared { addr: w[0], key: w[1], pool: w[2] }, ev)?;
            round_trips(Pool { pool: w[0], keep: w[1] }, ev)?;
            round_trips(GreenCtx { ctx: w[0], green: w[1] }, ev)?;
            round_trips(GraphNode { addr: w[0], size: w[1], graph: w[2] }, ev)?;
            round_trips(CheckpointCall { target: w[0] }, ev)?;
            round_trips(DeviceUuid { first: w[0], last: w[1] }, ev)?;
            round_trips(MulticastCall { mc: w[0], size: w[1], offset: w[2], memory: w[3] }, ev)?;
            round_trips(ShareableHandle { handle: w[0], key: w[1], kind: w[2] }, ev)?;
            round_trips(VmmCreate { handle: w[0], size: w[1] }, ev)?;
            round_trips(VmmRelease { handle: w[0] }, ev)?;
            round_trips(VmmMap { addr: w[0], size: w[1], offset: w[2], handle: w[3] }, ev)?;
            round_trips(VaRange { addr: w[0], size: w[1] }, ev)?;
            round_trips(Context { handle: w[0] }, ev)?;
            round_trips(MemInfo { free: w[0], total: w[1] }, ev)?;
            round_trips(Init { flags: w[0] }, ev)?;
            round_trips(OomFigures { total_vm_kib: w[0], anon_rss_kib: w[1], file_rss_kib: w[2], shmem_rss_kib: w[3] }, ev)?;
            round_trips(RmMap { memory: w[0], length: w[1], address: w[2] }, ev)?;
            round_trips(UvmRange { base: w[0], length: w[1] }, ev)?;
            round_trips(TensorAlloc { addr: w[0], size: w[1], stream: w[2] }, ev)?;
            round_trips(TensorFree { addr: w[0] }, ev)?;
            round_trips(RmAlloc { object: h[0], parent: h[1], root: h[2], class: h[3], flags: h[4], size: w[0] }, ev)?;
            round_trips(RmFree { object: h[0], parent: h[1], root: h[2] }, ev)?;
            round_trips(RmControl { object: h[0], cmd: w[0] }, ev)?;
        }
    }

    #[test]
    fn rm_handles_share_their_fields_as_the_kernel_side_packs_them() {
        let mut ev = Event::empty(crate::api::RM_ALLOC);
        RmAlloc { object: 0x20, parent: 0x10, root: 0xc1d0, class: 0x40, flags: 5, size: 64 << 20 }.pack(&mut ev);
        assert_eq!((ev.handle, ev.addr, ev.aux, ev.size), (0x20, 0xc1d0_0000_0010, 0x5_0000_0040, 64 << 20));
    }
}
