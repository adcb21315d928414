//! Contexts: which device each thread's calls go to, and the memory a
//! context takes with it when it is destroyed.
use std::collections::BTreeMap;

use gpumem_common::{
    payload::{MemInfo, Payload},
    ApiClass, Event, DEVICE_UNKNOWN,
};

use super::{
    process::{Memory, PrimaryCtx, Process},
    Applied, Release,
};

impl Process {
    /// The calling thread's current context, if known.
    pub fn current_ctx(&self, tid: u32) -> u64 {
        self.current(tid).0
    }

    /// Device of the calling thread's current context, if known.
    pub fn current_device(&self, tid: u32) -> i32 {
        self.current(tid).1
    }

    /// The calling thread's current context (0: none) and its device, looked up once.
    pub fn current(&self, tid: u32) -> (u64, i32) {
        let c = &self.held.contexts;
        let ctx = c.per_thread.get(&tid).and_then(|s| s.last().copied()).or(c.last);
        let device = ctx.and_then(|ctx| c.device_of.get(&ctx).copied()).or(self.assumed_device).unwrap_or(DEVICE_UNKNOWN);
        (ctx.unwrap_or(0), device)
    }

    /// The index of a context handle in `Contexts::ids`, added if new. A process
    /// has a few contexts, so a scan is cheaper than a map.
    pub fn ctx_index(&mut self, ctx: u64) -> u32 {
        let ids = &mut self.held.contexts.ids;
        match ids.iter().position(|&c| c == ctx) {
            Some(i) => i as u32,
            None => {
                ids.push(ctx);
                (ids.len() - 1) as u32
            }
        }
    }

    fn device_of(&self, ctx: u64) -> i32 {
        self.held.contexts.device_of.get(&ctx).copied().unwrap_or(DEVICE_UNKNOWN)
    }

    /// A successful context call.
    pub(super) fn apply_ctx(&mut self, class: ApiClass, ev: &Event, out: &mut Applied) {
        match class {
            ApiClass::CtxRetainPrimary => {
                let c = &mut self.held.contexts;
                c.device_of.insert(ev.handle, ev.device);
                let prim = c.primary.entry(ev.device).or_insert(PrimaryCtx { ctx: ev.handle, refs: 0 });
                prim.ctx = ev.handle;
                prim.refs += 1;
                c.last = Some(ev.handle);
            }
            ApiClass::CtxReleasePrimary => {
                // Only a release that we saw drop the count to zero destroys it:
                // retains made before the trace are unknown.
                let Some(prim) = self.held.contexts.primary.get_mut(&ev.device) else { return };
                if prim.refs > 0 {
                    prim.refs -= 1;
                    if prim.refs == 0 {
                        let ctx = prim.ctx;
                        out.released = self.release_ctx(ctx);
                    }
                }
            }
            ApiClass::CtxResetPrimary => {
                let Some(prim) = self.held.contexts.primary.get_mut(&ev.device) else { return };
                prim.refs = 0;
                let ctx = prim.ctx;
                out.released = self.release_ctx(ctx);
            }
            ApiClass::CtxCreate => {
                // cuCtxCreate makes the new context current on the calling thread.
                let c = &mut self.held.contexts;
                c.device_of.insert(ev.handle, ev.device);
                c.per_thread.entry(ev.tid).or_default().push(ev.handle);
                c.last = Some(ev.handle);
            }
            ApiClass::CtxSetCurrent => {
                let stack = self.held.contexts.per_thread.entry(ev.tid).or_default();
                stack.pop();
                if ev.handle != 0 {
                    stack.push(ev.handle);
                }
                out.device = self.device_of(ev.handle);
            }
            ApiClass::CtxPush => {
                self.held.contexts.per_thread.entry(ev.tid).or_default().push(ev.handle);
                out.device = self.device_of(ev.handle);
            }
            ApiClass::CtxPop => {
                if let Some(stack) = self.held.contexts.per_thread.get_mut(&ev.tid) {
                    stack.pop();
                }
                out.device = self.device_of(ev.handle);
            }
            ApiClass::CtxDestroy => {
                out.device = self.device_of(ev.handle);
                out.released = self.release_ctx(ev.handle);
                out.size = out.released.iter().map(|r| r.bytes).sum();
                let c = &mut self.held.contexts;
                c.device_of.remove(&ev.handle);
                for stack in c.per_thread.values_mut() {
                    stack.retain(|&ctx| ctx != ev.handle);
                }
                if c.last == Some(ev.handle) {
                    c.last = None;
                }
                c.primary.retain(|_, prim| prim.ctx != ev.handle);
            }
            ApiClass::GreenCtxCreate | ApiClass::CtxFromGreen | ApiClass::GreenCtxDestroy => self.apply_green(class, ev, out),
            ApiClass::MemGetInfo => {
                let device = self.current_device(ev.tid);
                out.device = device;
                let info = MemInfo::unpack(ev);
                self.held.reported_free.insert(device, (info.free, info.total));
            }
            _ => {}
        }
    }

    /// A green context is bound to its device; a context made from one runs
    /// there (it becomes current as any other, by set or push).
    fn apply_green(&mut self, class: ApiClass, ev: &Event, out: &mut Applied) {
        match class {
            ApiClass::GreenCtxCreate => {
                self.held.contexts.device_of.insert(ev.handle, ev.device);
            }
            ApiClass::CtxFromGreen => {
                let green = gpumem_common::payload::GreenCtx::unpack(ev).green;
                let device = self.device_of(green);
                out.device = device;
                self.held.contexts.device_of.insert(ev.handle, device);
            }
            _ => {
                out.device = self.device_of(ev.handle);
                self.held.contexts.device_of.remove(&ev.handle);
            }
        }
    }

    /// Frees every device allocation made in `ctx` (destroying a context frees
    /// its memory). VMM handles are not bound to a context and stay.
    fn release_ctx(&mut self, ctx: u64) -> Vec<Release> {
        let Some(ctx) = self.held.contexts.ids.iter().position(|&c| c == ctx).map(|i| i as u32) else { return Vec::new() };
        let addrs: Vec<u64> =
            self.held.allocs.iter().filter(|(_, a)| a.ctx() == ctx && a.memory() == Memory::Device).map(|(k, _)| k).collect();
        let mut by_dev: BTreeMap<i32, Release> = BTreeMap::new();
        for addr in addrs {
            let a = self.held.allocs.remove(addr).expect("present");
            self.pool_free(addr, a.size);
            let r = by_dev.entry(a.device()).or_insert(Release { device: a.device(), bytes: 0, allocs: 0 });
            r.bytes += a.size;
            r.allocs += 1;
            self.credit_free(&a);
        }
        by_dev.into_values().collect()
    }
}
