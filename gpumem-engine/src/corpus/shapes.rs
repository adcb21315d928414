//! The corpus's shapes: what each workload does, and which of its groups leak.
use super::{Script, Shape, CACHE, CHECKPOINT, LAYER_BASE, LEAK, LEAK2, MIB, POOL, TEMPS, WEIGHTS};

/// Every shape, labelled.
pub const SHAPES: &[Shape] = &[
    Shape {
        name: "leak_40mib_s_batched_frees_11",
        about: "40 MiB/s leak, temporaries freed 11 at a time",
        seconds: 40.0,
        leaks: &[LEAK],
        build: leak_40mib_s_batched_frees_11,
    },
    Shape {
        name: "leak_2mib_s_batched_frees_11",
        about: "2 MiB/s leak, temporaries freed 11 at a time",
        seconds: 60.0,
        leaks: &[LEAK],
        build: leak_2mib_s_batched_frees_11,
    },
    Shape {
        name: "leak_batched_frees_32",
        about: "8 MiB/s leak, temporaries freed 32 at a time",
        seconds: 60.0,
        leaks: &[LEAK],
        build: leak_batched_frees_32,
    },
    Shape {
        name: "churn_batched_frees_no_leak",
        about: "temporaries freed 11 at a time, nothing kept",
        seconds: 60.0,
        leaks: &[],
        build: churn_batched_frees_no_leak,
    },
    Shape {
        name: "sawtooth_cache_churn",
        about: "64 MiB up and down every second",
        seconds: 60.0,
        leaks: &[],
        build: sawtooth_cache_churn,
    },
    Shape {
        name: "slow_leak_under_sawtooth",
        about: "0.5 MiB/s leak under 64 MiB of churn",
        seconds: 90.0,
        leaks: &[LEAK],
        build: slow_leak_under_sawtooth,
    },
    Shape {
        name: "cache_steps_then_flat",
        about: "a cache grows 64 MiB every 3 s for 15 s, then holds",
        seconds: 60.0,
        leaks: &[],
        build: cache_steps_then_flat,
    },
    Shape {
        name: "warm_up_then_plateau",
        about: "1 GiB allocated over the first 5 s, then steady",
        seconds: 60.0,
        leaks: &[],
        build: warm_up_then_plateau,
    },
    Shape {
        name: "long_warm_up_then_plateau",
        about: "2 GiB allocated over the first 20 s, then steady",
        seconds: 80.0,
        leaks: &[],
        build: long_warm_up_then_plateau,
    },
    Shape {
        name: "graph_pool_once",
        about: "a 2 GiB CUDA-graph pool made at 10 s, kept",
        seconds: 60.0,
        leaks: &[],
        build: graph_pool_once,
    },
    Shape {
        name: "checkpoint_spikes",
        about: "1 GiB of checkpoint buffers for 2 s every 15 s",
        seconds: 75.0,
        leaks: &[],
        build: checkpoint_spikes,
    },
    Shape {
        name: "leak_under_checkpoints",
        about: "4 MiB/s leak with checkpoint spikes",
        seconds: 75.0,
        leaks: &[LEAK],
        build: leak_under_checkpoints,
    },
    Shape { name: "step_leak_every_5s", about: "16 MiB kept every 5 s", seconds: 60.0, leaks: &[LEAK], build: step_leak_every_5s },
    Shape {
        name: "step_leak_every_15s",
        about: "64 MiB kept every 15 s (an epoch's leak)",
        seconds: 120.0,
        leaks: &[LEAK],
        build: step_leak_every_15s,
    },
    Shape { name: "leak_starts_late", about: "steady for 30 s, then 8 MiB/s kept", seconds: 60.0, leaks: &[LEAK], build: leak_starts_late },
    Shape {
        name: "leak_that_stops",
        about: "8 MiB/s kept for 20 s, then held without growing",
        seconds: 60.0,
        leaks: &[],
        build: leak_that_stops,
    },
    Shape {
        name: "growth_freed_at_teardown",
        about: "8 MiB/s kept for 40 s, all freed at 45 s",
        seconds: 60.0,
        leaks: &[],
        build: growth_freed_at_teardown,
    },
    Shape { name: "two_leaks", about: "two stacks leaking, 4 and 1 MiB/s", seconds: 60.0, leaks: &[LEAK, LEAK2], build: two_leaks },
    Shape {
        name: "small_leak_among_many_layers",
        about: "24 layers' weights of 64 MiB each (a group each), 1 MiB/s leak",
        seconds: 75.0,
        leaks: &[LEAK],
        build: small_leak_among_many_layers,
    },
    Shape {
        name: "pool_grows_in_rounds_then_trims",
        about: "an async pool grows 256 MiB in three rounds, then gives half back",
        seconds: 60.0,
        leaks: &[],
        build: pool_grows_in_rounds_then_trims,
    },
    Shape { name: "idle_weights_only", about: "weights loaded, nothing else", seconds: 40.0, leaks: &[], build: weights },
    Shape {
        name: "leak_with_irregular_frees",
        about: "3 MiB/s leak; temporaries of varying size freed at irregular times",
        seconds: 60.0,
        leaks: &[LEAK],
        build: leak_with_irregular_frees,
    },
];

fn weights(s: &mut Script) {
    s.alloc(0.0, WEIGHTS, 256 * MIB);
}

fn leak_40mib_s_batched_frees_11(s: &mut Script) {
    weights(s);
    s.batched_temps(0.0, 40.0, 0.05, 4 * MIB, 11);
    s.leak(LEAK, 0.0, 40.0, 0.05, 2 * MIB);
}

fn leak_2mib_s_batched_frees_11(s: &mut Script) {
    weights(s);
    s.batched_temps(0.0, 60.0, 0.05, 4 * MIB, 11);
    s.leak(LEAK, 0.0, 60.0, 0.5, MIB);
}

fn leak_batched_frees_32(s: &mut Script) {
    weights(s);
    s.batched_temps(0.0, 60.0, 0.02, 2 * MIB, 32);
    s.leak(LEAK, 0.0, 60.0, 0.25, 2 * MIB);
}

fn churn_batched_frees_no_leak(s: &mut Script) {
    weights(s);
    s.batched_temps(0.0, 60.0, 0.05, 4 * MIB, 11);
}

fn sawtooth_cache_churn(s: &mut Script) {
    weights(s);
    s.batched_temps(0.0, 60.0, 0.0625, 4 * MIB, 16);
}

fn slow_leak_under_sawtooth(s: &mut Script) {
    weights(s);
    s.batched_temps(0.0, 90.0, 0.0625, 4 * MIB, 16);
    s.leak(LEAK, 0.0, 90.0, 1.0, MIB / 2);
}

fn cache_steps_then_flat(s: &mut Script) {
    weights(s);
    s.batched_temps(0.0, 60.0, 0.05, 4 * MIB, 11);
    s.leak(CACHE, 0.0, 15.0, 3.0, 64 * MIB);
}

fn warm_up_then_plateau(s: &mut Script) {
    weights(s);
    s.leak(CACHE, 0.0, 5.0, 0.05, 10 * MIB);
    s.batched_temps(0.0, 60.0, 0.05, 4 * MIB, 11);
}

fn long_warm_up_then_plateau(s: &mut Script) {
    weights(s);
    s.leak(CACHE, 0.0, 20.0, 0.1, 10 * MIB);
    s.batched_temps(0.0, 80.0, 0.05, 4 * MIB, 11);
}

fn graph_pool_once(s: &mut Script) {
    weights(s);
    s.alloc(10.0, POOL, 2048 * MIB);
    s.batched_temps(0.0, 60.0, 0.05, 4 * MIB, 11);
}

fn checkpoint_spikes(s: &mut Script) {
    weights(s);
    s.batched_temps(0.0, 75.0, 0.05, 4 * MIB, 11);
    for t in Script::steps(5.0, 75.0, 15.0) {
        let bufs = s.leak(CHECKPOINT, t, t + 0.5, 0.05, 100 * MIB);
        for a in bufs {
            s.free(t + 2.0, a);
        }
    }
}

fn leak_under_checkpoints(s: &mut Script) {
    weights(s);
    s.batched_temps(0.0, 75.0, 0.05, 4 * MIB, 11);
    s.leak(LEAK, 0.0, 75.0, 0.5, 2 * MIB);
    for t in Script::steps(5.0, 75.0, 15.0) {
        let bufs = s.leak(CHECKPOINT, t, t + 0.5, 0.05, 100 * MIB);
        for a in bufs {
            s.free(t + 2.0, a);
        }
    }
}

fn step_leak_every_5s(s: &mut Script) {
    weights(s);
    s.batched_temps(0.0, 60.0, 0.05, 4 * MIB, 11);
    s.leak(LEAK, 0.0, 60.0, 5.0, 16 * MIB);
}

fn step_leak_every_15s(s: &mut Script) {
    weights(s);
    s.batched_temps(0.0, 120.0, 0.05, 4 * MIB, 11);
    s.leak(LEAK, 0.0, 120.0, 15.0, 64 * MIB);
}

fn leak_starts_late(s: &mut Script) {
    weights(s);
    s.batched_temps(0.0, 60.0, 0.05, 4 * MIB, 11);
    s.leak(LEAK, 30.0, 60.0, 0.25, 2 * MIB);
}

fn leak_that_stops(s: &mut Script) {
    weights(s);
    s.batched_temps(0.0, 60.0, 0.05, 4 * MIB, 11);
    s.leak(LEAK, 0.0, 20.0, 0.25, 2 * MIB);
}

fn growth_freed_at_teardown(s: &mut Script) {
    weights(s);
    s.batched_temps(0.0, 60.0, 0.05, 4 * MIB, 11);
    for a in s.leak(LEAK, 0.0, 40.0, 0.25, 2 * MIB) {
        s.free(45.0, a);
    }
}

fn two_leaks(s: &mut Script) {
    weights(s);
    s.batched_temps(0.0, 60.0, 0.05, 4 * MIB, 11);
    s.leak(LEAK, 0.0, 60.0, 0.5, 2 * MIB);
    s.leak(LEAK2, 0.0, 60.0, 1.0, MIB);
}

fn small_leak_among_many_layers(s: &mut Script) {
    for layer in 0..24 {
        s.alloc(0.0, LAYER_BASE + layer, 64 * MIB);
    }
    s.batched_temps(0.0, 75.0, 0.05, 4 * MIB, 11);
    s.leak(LEAK, 0.0, 75.0, 0.5, MIB / 2);
}

fn pool_grows_in_rounds_then_trims(s: &mut Script) {
    weights(s);
    let mut blocks = Vec::new();
    for round in 0..3 {
        blocks.extend(s.leak(POOL, 2.0 + 6.0 * round as f64, 4.0 + 6.0 * round as f64, 0.25, 32 * MIB));
    }
    for a in blocks.iter().step_by(2) {
        s.free(30.0, *a);
    }
    s.batched_temps(0.0, 60.0, 0.05, 4 * MIB, 11);
}

fn leak_with_irregular_frees(s: &mut Script) {
    weights(s);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut pending = Vec::new();
    for t in Script::steps(0.0, 60.0, 0.05) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        pending.push(s.alloc(t, TEMPS, (1 + rng % 8) * MIB));
        if rng.is_multiple_of(7) {
            for a in pending.drain(..) {
                s.free(t + 0.001, a);
            }
        }
    }
    s.leak(LEAK, 0.0, 60.0, 0.5, 3 * MIB / 2);
}
