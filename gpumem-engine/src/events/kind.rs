//! What an event is, with its overloaded fields decoded by the payloads the
//! kernel side packed them with (gpumem_common::payload: RM handles, OOM
//! figures, UVM ranges). Everything downstream (state, analyses, outputs)
//! matches on `Kind`; arithmetic on untrusted figures is checked.
use gpumem_common::{
    api, api_info,
    payload::{OomFigures, Payload, PitchAlloc, RmAlloc, RmControl, RmFree, RmMap, UvmRange},
    ApiClass, ApiInfo, Event,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A libcuda call: what it does follows from its class.
    Cuda(&'static ApiInfo),
    /// The process exited (`sched:sched_process_exit`).
    Exit,
    /// A host OOM kill (`oom:mark_victim`); the event's pid and comm are the victim's.
    OomKill(OomKill),
    /// An NVIDIA resource-manager escape; the RM status is the event's result.
    Rm(Rm),
    /// An NVIDIA UVM ioctl.
    Uvm(Uvm),
    /// PyTorch's allocator handed out a tensor (`pytorch:malloc`): `addr`,
    /// `size` asked, `device`, the stream in `aux`.
    TensorAlloc,
    /// PyTorch's allocator took a tensor back (`pytorch:free`): `addr`.
    TensorFree,
    /// An id this agent does not know (a newer kernel side, a damaged recording).
    Unknown,
}

/// A host OOM kill. Sizes come from the kernel in KiB; a figure whose byte
/// count does not fit in 64 bits (a crafted recording) is None.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomKill {
    /// The task whose allocation triggered the kill.
    pub trigger_tid: u32,
    pub total_vm_bytes: Option<u64>,
    pub anon_rss_bytes: Option<u64>,
    pub file_rss_bytes: Option<u64>,
    pub shmem_rss_bytes: Option<u64>,
}

/// RM handles are 32 bits; the kernel side packs parent and root into one field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rm {
    /// NV_ESC_RM_ALLOC: `size` is the requested size for video memory (class 0x40).
    Alloc { object: u32, parent: u32, root: u32, class: u32, flags: u32, size: u64 },
    /// NV_ESC_RM_FREE: frees the object and everything allocated under it.
    Free { object: u32, parent: u32, root: u32 },
    /// NV_ESC_RM_CONTROL.
    Control { object: u32, cmd: u64 },
    /// NV_ESC_RM_MAP_MEMORY (`dma`: _DMA).
    Map { memory: u32, length: u64, address: u64, dma: bool },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uvm {
    /// UVM_MAP_EXTERNAL_ALLOCATION.
    Map { base: u64, length: u64 },
    /// UVM_FREE.
    Free { base: u64 },
}

fn kib(v: u64) -> Option<u64> {
    v.checked_mul(1024)
}

impl Kind {
    pub fn of(ev: &Event) -> Kind {
        if let Some(info) = api_info(ev.api) {
            return Kind::Cuda(info);
        }
        match ev.api {
            api::PROCESS_EXIT => Kind::Exit,
            api::OOM_KILL => {
                let f = OomFigures::unpack(ev);
                Kind::OomKill(OomKill {
                    trigger_tid: ev.tid,
                    total_vm_bytes: kib(f.total_vm_kib),
                    anon_rss_bytes: kib(f.anon_rss_kib),
                    file_rss_bytes: kib(f.file_rss_kib),
                    shmem_rss_bytes: kib(f.shmem_rss_kib),
                })
            }
            api::RM_ALLOC => {
                let RmAlloc { object, parent, root, class, flags, size } = RmAlloc::unpack(ev);
                Kind::Rm(Rm::Alloc { object, parent, root, class, flags, size })
            }
            api::RM_FREE => {
                let RmFree { object, parent, root } = RmFree::unpack(ev);
                Kind::Rm(Rm::Free { object, parent, root })
            }
            api::RM_CONTROL => {
                let RmControl { object, cmd } = RmControl::unpack(ev);
                Kind::Rm(Rm::Control { object, cmd })
            }
            api::RM_MAP_MEMORY | api::RM_MAP_MEMORY_DMA => {
                let m = RmMap::unpack(ev);
                // RM handles are 32 bits.
                Kind::Rm(Rm::Map { memory: m.memory as u32, length: m.length, address: m.address, dma: ev.api == api::RM_MAP_MEMORY_DMA })
            }
            api::UVM_MAP_EXTERNAL_ALLOCATION => {
                let r = UvmRange::unpack(ev);
                Kind::Uvm(Uvm::Map { base: r.base, length: r.length })
            }
            api::UVM_FREE => Kind::Uvm(Uvm::Free { base: UvmRange::unpack(ev).base }),
            api::TENSOR_ALLOC => Kind::TensorAlloc,
            api::TENSOR_FREE => Kind::TensorFree,
            _ => Kind::Unknown,
        }
    }

    /// A call into the NVIDIA driver through an ioctl (RM or UVM).
    pub fn is_ioctl(&self) -> bool {
        matches!(self, Kind::Rm(_) | Kind::Uvm(_))
    }

    /// The row pitch of a cuMemAllocPitch_v2 (its `aux`; `size` is pitch × height).
    pub fn pitch(&self, ev: &Event) -> Option<u64> {
        matches!(self, Kind::Cuda(info) if info.id == api::CU_MEM_ALLOC_PITCH_V2).then(|| PitchAlloc::unpack(ev).pitch)
    }

    /// Whether applying it can free memory implicitly (what it released is
    /// then always said, even when nothing was).
    pub fn may_release(&self) -> bool {
        match self {
            Kind::Exit => true,
            Kind::Cuda(info) => matches!(
                info.class,
                ApiClass::CtxDestroy | ApiClass::CtxReleasePrimary | ApiClass::CtxResetPrimary | ApiClass::VmmRelease | ApiClass::VmmUnmap
            ),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use gpumem_common::{api, ApiClass, Event};

    use super::*;

    #[test]
    fn packed_fields_are_unpacked() {
        let rm = Event { handle: 0x1_0000_0020, addr: 0xc1d0_0000_0010, aux: 0x5_0000_0040, size: 64 << 20, ..Event::empty(api::RM_ALLOC) };
        assert_eq!(Kind::of(&rm), Kind::Rm(Rm::Alloc { object: 0x20, parent: 0x10, root: 0xc1d0, class: 0x40, flags: 5, size: 64 << 20 }));
        let free = Event { handle: 0x20, addr: 0xc1d0_0000_0010, ..Event::empty(api::RM_FREE) };
        assert_eq!(Kind::of(&free), Kind::Rm(Rm::Free { object: 0x20, parent: 0x10, root: 0xc1d0 }));
        assert!(Kind::of(&free).is_ioctl());
        match Kind::of(&Event::empty(api::CU_MEM_ALLOC_V2)) {
            Kind::Cuda(info) => assert_eq!(info.class, ApiClass::DeviceAlloc),
            k => panic!("{k:?}"),
        }
        assert_eq!(Kind::of(&Event::empty(999)), Kind::Unknown);
    }

    #[test]
    fn oom_figures_at_their_extremes_do_not_wrap() {
        let e = Event { tid: 9, addr: u64::MAX, size: 1 << 54, handle: (1 << 54) - 1, aux: 0, ..Event::empty(api::OOM_KILL) };
        let Kind::OomKill(k) = Kind::of(&e) else { panic!() };
        assert_eq!(k.trigger_tid, 9);
        assert_eq!(k.total_vm_bytes, None, "u64::MAX KiB is not a number of bytes");
        assert_eq!(k.anon_rss_bytes, None);
        assert_eq!(k.file_rss_bytes, Some(((1u64 << 54) - 1) * 1024));
        assert_eq!(k.shmem_rss_bytes, Some(0));
    }
}
