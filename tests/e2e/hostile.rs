//! Hostile and broken inputs (issue 30): what a local user or container
//! shapes — file names, paths — reaches the agent, which stays exact for it
//! and escapes it everywhere it shows it.
use std::{ffi::OsStr, os::unix::ffi::OsStrExt as _};

use gpumem_tests::*;
use serde_json::Value;

/// A copy of the synthetic libcuda in a directory whose name is `dir`
/// (bytes: a newline, spaces, not UTF-8 if it likes), a fresh inode.
fn libcuda_under(dir: &[u8]) -> std::path::PathBuf {
    let f = fixtures();
    let dir = f.dir.join("hostile").join(OsStr::from_bytes(dir));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libcuda.so.1");
    let _ = std::fs::remove_file(&lib);
    std::fs::copy(&f.libcuda, &lib).unwrap();
    lib
}

#[test]
fn a_libcuda_under_a_path_with_a_newline_and_spaces_is_attached_and_exact() {
    require_root();
    let f = fixtures();
    // The kernel writes the newline as \012 in /proc/PID/maps.
    let lib = libcuda_under(b"lib dir\n  with newline");
    // sh keeps a newline inside single quotes.
    let cmd = format!("{} '{}' late_load", f.workload.display(), lib.display());
    let t = trace(&["-c", &cmd], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    let pid = single_pid(&t);
    assert_eq!(t.of_type("init").len(), 1, "attached before cuInit: {}", t.stderr);
    assert_eq!(sizes(&t.of_type("alloc")), [8 * MIB, 4 * MIB]);
    assert_eq!(t.released_at_exit(pid), [(0, 4 * MIB, 1)]);
    // Named on one line, the newline escaped: no line of the agent's starts
    // with what followed it.
    assert!(t.stderr.contains("lib dir?  with newline/libcuda.so.1"), "{}", t.stderr);
    assert!(!t.stderr.lines().any(|l| l.starts_with("  with newline")), "{}", t.stderr);
}

#[test]
fn a_libcuda_whose_path_is_not_utf8_is_attached_and_exact_system_wide() {
    require_root();
    let f = fixtures();
    let lib = libcuda_under(b"bad \xff\xfe name\nx");
    // System-wide: found through the process's maps (not -c, not --libcuda);
    // the loader hook attaches it within the workload's 1 s before cuInit.
    let (agent, stderr) = start_agent(&["--duration", "6"]);
    let st = std::process::Command::new(&f.workload).arg(&lib).arg("late_load").env("GPUMEM_WORKLOAD_DELAY_MS", "1500").status().unwrap();
    assert!(st.success());
    let (lines, said) = finish_agent(agent, stderr);
    let pid =
        lines.iter().find(|e| e["type"] == "init").and_then(|e| e["pid"].as_u64()).unwrap_or_else(|| panic!("no cuInit traced: {said}"));
    let allocs: Vec<&Value> = lines.iter().filter(|e| e["type"] == "alloc" && e["pid"] == pid).collect();
    assert_eq!(sizes(&allocs), [8 * MIB, 4 * MIB], "{said}");
    let exit = lines.iter().find(|e| e["type"] == "exit" && e["pid"] == pid).expect("exit event");
    assert_eq!(released(exit), [(0, 4 * MIB, 1)]);
    assert!(said.contains("bad \u{fffd}\u{fffd} name?x/libcuda.so.1"), "{said}");
}

/// A raw request over the local API's socket, made by `uid`:`gid` (Debian's
/// python, which any user may run): the response's bytes as text.
fn ask_as(socket: &std::path::Path, uid: u32, gid: u32, request: &str) -> String {
    use std::os::unix::process::CommandExt as _;
    const CLIENT: &str = "import socket, sys\n\
        s = socket.socket(socket.AF_UNIX)\n\
        s.connect(sys.argv[1])\n\
        s.sendall(sys.argv[2].encode())\n\
        out = b''\n\
        while True:\n\
        \x20   b = s.recv(65536)\n\
        \x20   if not b: break\n\
        \x20   out += b\n\
        sys.stdout.write(out.decode(errors='replace'))\n";
    let out =
        std::process::Command::new("/usr/bin/python3.11").args(["-c", CLIENT]).arg(socket).arg(request).gid(gid).uid(uid).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_local_api_checks_its_peer_and_refuses_what_is_not_its_protocol() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    require_root();
    let f = fixtures();
    let state = ServeState::new("peer");
    let mut args = state.args();
    args.extend(["--libcuda", f.libcuda.to_str().unwrap(), "--socket-group", "4242"].map(String::from));
    let mut serve = Serve::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    // The socket is the agent's and the group's...
    let meta = std::fs::metadata(&state.socket).unwrap();
    assert_eq!((meta.mode() & 0o777, meta.gid()), (0o660, 4242));
    // ...and each connection's peer is checked whatever the file lets
    // through (opened to everyone here, as a mistake would).
    std::fs::set_permissions(&state.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let get = "GET /v1/status HTTP/1.1\r\nhost: gpumem\r\nconnection: close\r\n\r\n";
    let nobody = ask_as(&state.socket, 65534, 65534, get);
    assert!(nobody.starts_with("HTTP/1.1 403"), "{nobody}");
    assert!(nobody.contains("gpumem: uid 65534 may not use this agent's local API (root, uid 0 or group 4242 only)"), "{nobody}");
    let member = ask_as(&state.socket, 65534, 4242, get);
    assert!(member.starts_with("HTTP/1.1 200"), "a member of the group is let in: {member}");
    // What is not HTTP, or is too long, gets an error, not an answer.
    let garbage = ask_as(&state.socket, 0, 0, "\x16\x03\x01 not http at all\r\n\r\n");
    assert!(garbage.starts_with("HTTP/1.1 400"), "{garbage:?}");
    let long = format!("GET /v1/leaks?pids={} HTTP/1.1\r\nhost: gpumem\r\nconnection: close\r\n\r\n", "1,".repeat(4000));
    let long = ask_as(&state.socket, 0, 0, &long);
    assert!(long.starts_with("HTTP/1.1 414") && long.contains("a query is at most 4096 bytes"), "{long}");
    serve.state = Some(state);
    let (status, said) = serve.stop();
    assert!(status.success(), "{said}");
    assert!(said.contains("uid 65534 may not use this agent's local API") && said.contains("refused 1 connection(s) so far"), "{said}");
}

/// A cgroup named with a newline would forge a line of /proc/PID/cgroup
/// (the kernel writes paths there unescaped) naming another pod's
/// container. This kernel refuses such names; the agent checks each file's
/// hierarchies against its own anyway (procfs::read_cgroup, unit-tested),
/// for kernels and cgroup managers that let one through.
#[test]
fn the_kernel_refuses_a_cgroup_name_that_could_forge_another_containers_line() {
    require_root();
    let forged = std::path::Path::new("/sys/fs/cgroup/memory/gpumem-forge\n0::");
    let e = std::fs::create_dir(forged).expect_err("a cgroup named with a newline");
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
}

#[test]
fn a_forged_interpreter_is_refused_and_named_while_a_real_python_process_keeps_its_frames() {
    require_root();
    let f = fixtures();
    let lib = forged_interpreter();
    // Side by side in one session: the forged process (it holds its memory a
    // while, so that the agent looks at it) and a real CPython loop.
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/train.py");
    let cmd = format!(
        "LD_PRELOAD='{}' GPUMEM_WORKLOAD_HOLD_MS=3000 {} & /usr/bin/python3.11 {} {}; wait",
        lib.display(),
        workload_cmd("late_load"),
        script.display(),
        f.libcuda.display()
    );
    let t = trace(&["-c", &cmd], &[("GPUMEM_STEPS", "5"), ("GPUMEM_HOLD", "0")]);
    assert!(t.status.success(), "{}", t.stderr);
    let summary = &t.summary;
    let unwalked = summary["python_unwalked"].as_array().unwrap_or_else(|| panic!("{summary:#}"));
    assert_eq!(unwalked.len(), 1, "{unwalked:?}");
    let forged = unwalked[0]["pid"].as_u64().unwrap();
    assert!(unwalked[0]["why"].as_str().unwrap().contains("list loops"), "{unwalked:?}");
    // Its allocations exact, with native stacks.
    let allocs = t.of_type("alloc");
    let of = |pid: u64| allocs.iter().copied().filter(|a| a["pid"] == pid).collect::<Vec<_>>();
    assert_eq!(sizes(&of(forged)), [8 * MIB, 4 * MIB]);
    assert_eq!(t.released_at_exit(forged), [(0, 4 * MIB, 1)]);
    assert!(of(forged).iter().all(|a| python_frames(a).is_empty()));
    // The real Python process beside it keeps every Python frame.
    let python = t.pids().into_iter().find(|&p| p != forged).expect("the Python process");
    let py_allocs = of(python);
    assert_eq!(py_allocs.len(), 11, "weights, 5 scratch buffers, 5 activations");
    for a in &py_allocs {
        let frames = python_frames(a);
        assert_eq!(frames.last().map(|f| f.0.as_str()), Some("<module>"), "{a}");
    }
}

/// The forged interpreter library (tests/fixtures/forged_python.c), built once.
fn forged_interpreter() -> std::path::PathBuf {
    let dir = fixtures().dir.join("hostile/forged-python");
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libpython3.11.so.1.0");
    let tmp = dir.join("libpython3.11.so.1.0.tmp");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/forged_python.c");
    let out = std::process::Command::new("cc").args(["-shared", "-fPIC", "-O2", "-o"]).arg(&tmp).arg(&src).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::rename(&tmp, &lib).unwrap();
    lib
}

#[test]
fn python_frames_at_unmapped_memory_end_the_walk_show_as_unknown_and_the_bytes_stay_exact() {
    require_root();
    let lib = forged_interpreter();
    let cmd = format!("LD_PRELOAD='{}' GPUMEM_FORGE=frames GPUMEM_WORKLOAD_HOLD_MS=1500 {}", lib.display(), workload_cmd("late_load"));
    let t = trace(&["-c", &cmd], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    let pid = single_pid(&t);
    let allocs = t.of_type("alloc");
    assert_eq!(sizes(&allocs), [8 * MIB, 4 * MIB]);
    assert_eq!(t.released_at_exit(pid), [(0, 4 * MIB, 1)]);
    // Believed (its lists are sound), walked two frames deep, neither
    // readable; the third is unmapped, where the kernel's walk ends (counted
    // in gpumem_probe_exits_total{reason="py_frame_unreadable"}).
    assert!(t.summary["python_unwalked"].as_array().is_none_or(|u| u.is_empty()), "{:#}", t.summary);
    for a in &allocs {
        let frames = python_frames(a);
        assert_eq!(frames.iter().map(|f| (f.0.as_str(), f.1.as_str())).collect::<Vec<_>>(), [("?", "?"), ("?", "?")], "{a}");
    }
}

#[test]
fn a_garbage_file_named_libcuda_is_refused_with_why_and_the_real_one_stays_exact() {
    require_root();
    // Not an ELF file, mapped executable by a process under libcuda's name.
    let fake = libcuda_under(b"garbage");
    std::fs::write(&fake, (0..65536u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect::<Vec<u8>>()).unwrap();
    refused_while_the_real_one_stays_exact("garbage/libcuda.so.1", &fake, "is not an ELF shared library");
}

#[test]
fn a_libcuda_built_for_another_machine_gets_no_probe_and_the_real_one_stays_exact() {
    require_root();
    // The synthetic driver built for aarch64: what a process under qemu-user
    // (a multi-arch container build) maps. A breakpoint in it would be x86's
    // int3 written into aarch64 code that the emulator then translates.
    let fake = libcuda_under(b"aarch64");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake_libcuda.c");
    let cc = std::process::Command::new("aarch64-linux-gnu-gcc")
        .args(["-shared", "-fPIC", "-O2", "-o", fake.to_str().unwrap(), src.to_str().unwrap(), "-lpthread"])
        .status()
        .expect("aarch64-linux-gnu-gcc (gcc-aarch64-linux-gnu; cargo xtask setup installs it)");
    assert!(cc.success());
    refused_while_the_real_one_stays_exact(
        "aarch64/libcuda.so.1",
        &fake,
        "is code for Aarch64, not for this machine (X86_64): no probe goes into it",
    );
}

/// A process maps `fake` (named libcuda.so.1) executable while a workload
/// allocates through the real synthetic driver: the agent says the copy is
/// not attached and why, and the workload's allocations are exact.
fn refused_while_the_real_one_stays_exact(named: &str, fake: &std::path::Path, why: &str) {
    let f = fixtures();
    // The dlopen after the mapping (ctypes' extension) is what tells the
    // agent to read the process's maps again (its loader hook): the agent
    // read them at exec, before the mapping existed.
    const MAPPER: &str = "import mmap, sys, time\n\
        f = open(sys.argv[1], 'rb')\n\
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC)\n\
        import ctypes\n\
        print('mapped', flush=True)\n\
        time.sleep(4)\n";
    let (agent, stderr) = start_agent(&["--duration", "6"]);
    let mut mapper = std::process::Command::new("/usr/bin/python3.11")
        .args(["-c", MAPPER])
        .arg(fake)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said_mapped = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(mapper.stdout.take().unwrap()), &mut said_mapped).unwrap();
    assert_eq!(said_mapped.trim(), "mapped");
    let st =
        std::process::Command::new(&f.workload).arg(&f.libcuda).arg("late_load").env("GPUMEM_WORKLOAD_DELAY_MS", "1500").status().unwrap();
    assert!(st.success());
    let _ = mapper.wait();
    let (lines, said) = finish_agent(agent, stderr);
    assert!(said.contains(named) && said.contains("not attached") && said.contains(why), "{said}");
    let pid =
        lines.iter().find(|e| e["type"] == "init").and_then(|e| e["pid"].as_u64()).unwrap_or_else(|| panic!("no cuInit traced: {said}"));
    let allocs: Vec<&Value> = lines.iter().filter(|e| e["type"] == "alloc" && e["pid"] == pid).collect();
    assert_eq!(sizes(&allocs), [8 * MIB, 4 * MIB], "{said}");
}

/// The name `GPUMEM_WORKLOAD_EVIL_NAME` gives a workload: a screen-clearing
/// escape sequence, a quote, a backslash, a newline, braces.
const EVIL_COMM: &str = "ev\x1b[2J\"\\\n{}";

#[test]
fn a_hostile_name_reaches_an_actions_stdin_and_a_webhook_body_exactly_and_never_its_argument_list() {
    require_root();
    let f = fixtures();
    let d = target_dir().join("hostile-actions");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let receiver = Receiver::start(0, 200);
    // The command records its argument list and environment as it got them.
    let hook =
        format!("cuda_oom=cat > {0}/event.json; printf '%s\\n' \"$0\" \"$@\" > {0}/argv; echo \"$GPUMEM_EVENT\" > {0}/kind", d.display());
    let webhook = receiver.url("/hooks/gpumem");
    let serve = Serve::start(&["--libcuda", f.libcuda.to_str().unwrap(), "--no-nvml", "--action", &hook, "--webhook", &webhook], &[]);
    let mut w = spawn_workload(
        "oom",
        &[("GPUMEM_FAKE_CAPACITY", "67108864"), ("GPUMEM_WORKLOAD_HOLD_MS", "3000"), ("GPUMEM_WORKLOAD_EVIL_NAME", "1")],
    );
    let read = |p: &str| std::fs::read_to_string(d.join(p)).ok();
    let event: Value = poll(20, "the hook's event.json", || serde_json::from_str(&read("event.json")?).ok(), || serve.metrics());
    assert_eq!(event["comm"], EVIL_COMM, "the exact name, JSON-escaped: {event:#}");
    assert!(event["summary"].as_str().unwrap().contains("CUDA out of memory"), "{event:#}");
    assert_eq!(read("kind").unwrap().trim(), "cuda_oom");
    let argv = read("argv").unwrap();
    assert!(!argv.contains("ev") && !argv.contains('\x1b'), "no event text in the argument list: {argv:?}");
    let posts = poll(20, "the webhook's delivery", || (!receiver.all().is_empty()).then(|| receiver.all()), || serve.metrics());
    let body = posts[0].json();
    assert_eq!(body["comm"], EVIL_COMM);
    assert_eq!(body, event, "the webhook gets what the hook got");
    assert!(!posts[0].body.contains(&0x1b), "the escape is JSON-escaped in the body");
    let _ = w.wait();
    serve.stop();
}

/// A copy of the synthetic libcuda whose symbol table holds more symbols
/// than the agent reads of one file (formats::budget::MAX_SYMBOLS).
fn libcuda_with_an_enormous_symbol_table() -> std::path::PathBuf {
    let dir = fixtures().dir.join("hostile/enormous-symbols");
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libcuda.so.1");
    if lib.exists() {
        return lib;
    }
    let asm = dir.join("symbols.s");
    let mut text = String::from(".text\n");
    for i in 0..(1 << 17) + 1000 {
        text.push_str(&format!(".type s{i},@function\ns{i}: ret\n"));
    }
    std::fs::write(&asm, text).unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake_libcuda.c");
    let tmp = dir.join("libcuda.so.1.tmp");
    let out = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&tmp)
        .arg(&src)
        .arg(&asm)
        .arg("-lpthread")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::rename(&tmp, &lib).unwrap();
    lib
}

/// The agent's peak resident memory (KiB) and CPU seconds so far.
fn rss_and_cpu(pid: u32) -> (u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hwm = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hwm, ticks as f64 / hz as f64)
}

/// Peak resident memory the agent stays under beside a hostile tenant, and
/// the share of one core it may use on average (both stated in the README's
/// threat model).
const HOSTILE_RSS_MAX_MIB: u64 = 160;
const HOSTILE_CPU_SHARE_MAX: f64 = 0.5;

#[test]
fn beside_a_hostile_tenant_the_agent_stays_within_its_bounds_names_it_and_keeps_others_exact() {
    require_root();
    let f = fixtures();
    let enormous = libcuda_with_an_enormous_symbol_table();
    let forged_lib = forged_interpreter();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hostile_python.py");

    let began = std::time::Instant::now();
    let (mut agent, stderr) = start_agent(&["--duration", "12"]);
    let agent_pid = agent.id();
    // Read as it comes: the tenant's events fill a pipe's 64 KiB long before the end.
    let mut stdout = agent.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut text).unwrap();
        text
    });
    let (_, cpu_before) = rss_and_cpu(agent_pid);
    let spawn = |cmd: &mut std::process::Command| cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
    // The tenant: a libcuda copy with a 132 000-symbol table, a forged
    // interpreter, and a real CPython whose 300 functions have 60 KiB line
    // tables and 60 000-character names.
    let huge = spawn(std::process::Command::new(&f.workload).arg(&enormous).arg("late_load").env("GPUMEM_WORKLOAD_DELAY_MS", "1500"));
    let forged = spawn(
        std::process::Command::new(&f.workload)
            .arg(&f.libcuda)
            .arg("late_load")
            .env("GPUMEM_WORKLOAD_DELAY_MS", "1500")
            .env("LD_PRELOAD", &forged_lib)
            .env("GPUMEM_WORKLOAD_HOLD_MS", "3000"),
    );
    let names = spawn(std::process::Command::new("/usr/bin/python3.11").arg(&script).arg(&f.libcuda).arg("tables"));
    // Another tenant, ordinary.
    let plain = spawn(std::process::Command::new(&f.workload).arg(&f.libcuda).arg("late_load").env("GPUMEM_WORKLOAD_DELAY_MS", "500"));
    let pids = [huge.id(), forged.id(), names.id(), plain.id()].map(u64::from);
    for child in [huge, forged, names, plain] {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{:?}", out);
    }
    let (rss_kib, cpu_after) = rss_and_cpu(agent_pid);
    let wall = began.elapsed().as_secs_f64();
    assert!(agent.wait().unwrap().success());
    let said = stderr.join().unwrap();
    let lines: Vec<Value> = reader.join().unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let cpu = cpu_after - cpu_before;
    println!(
        "beside the hostile tenant: agent peak RSS {} MiB, CPU {cpu:.2} s over {wall:.1} s ({:.0}% of a core)",
        rss_kib >> 10,
        100.0 * cpu / wall
    );
    assert!(rss_kib >> 10 < HOSTILE_RSS_MAX_MIB, "agent peak RSS {} MiB", rss_kib >> 10);
    assert!(cpu / wall < HOSTILE_CPU_SHARE_MAX, "agent CPU {cpu:.2} s over {wall:.1} s");

    let [huge, forged, names, plain] = pids;
    let allocs = |pid: u64| lines.iter().filter(|e| e["type"] == "alloc" && e["pid"] == pid).collect::<Vec<_>>();
    let summary = lines.iter().find(|e| e["type"] == "summary").expect("a summary");
    let degraded = |pid: u64| {
        summary["degraded"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["pid"] == pid)
            .map(|d| d["reason"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    // The enormous copy: refused, with why, its process named; nothing else disturbed.
    assert!(said.contains("enormous-symbols/libcuda.so.1") && said.contains("symbol tables hold over 131072 symbols"), "{said}");
    assert_eq!(degraded(huge), ["library_tables"], "{summary:#}");
    assert!(allocs(huge).is_empty(), "its copy is not attached");
    // The forged interpreter: refused, its allocations exact with native stacks.
    assert_eq!(degraded(forged), ["python_threads"], "{summary:#}");
    assert_eq!(sizes(&allocs(forged)), [8 * MIB, 4 * MIB]);
    // The long tables: every allocation exact; the first code objects read
    // (their names cut at 1 024 characters), the rest `?` past the
    // process's read budget.
    let named = allocs(names);
    assert_eq!(sizes(&named), vec![64 * 1024; 300]);
    // Innermost: `alloc`, then the function named 60 000 times over.
    let inner = |a: &Value| python_frames(a).get(1).map(|f| f.0.clone()).unwrap_or_default();
    let read = named.iter().filter(|a| inner(a).starts_with("fff") && inner(a).ends_with('…') && inner(a).chars().count() == 1025).count();
    let refused = named.iter().filter(|a| inner(a) == "?").count();
    println!("long tables: {read} code objects read, {refused} refused past the budget");
    assert_eq!(degraded(names), ["python_reads"], "{summary:#}");
    // Any other allocation is shown (its Python frames, names cut). One was
    // named "" in some CI runs: a read after the budget refilled found the
    // code object freed (the fixture let its functions go before its pause).
    let odd: Vec<Vec<String>> = named
        .iter()
        .filter(|a| !(inner(a) == "?" || inner(a).starts_with("fff") && inner(a).ends_with('…')))
        .map(|a| python_frames(a).iter().map(|f| f.0.chars().take(24).collect()).collect())
        .collect();
    assert!(read >= 20 && refused >= 100 && read + refused == 300, "read {read}, refused {refused}; the others' Python frames: {odd:?}");
    // The ordinary tenant: exact, not degraded.
    assert_eq!(sizes(&allocs(plain)), [8 * MIB, 4 * MIB]);
    assert!(degraded(plain).is_empty());
    let exit = lines.iter().find(|e| e["type"] == "exit" && e["pid"] == plain).expect("exit event");
    assert_eq!(released(exit), [(0, 4 * MIB, 1)]);
}

#[test]
fn a_python_thread_list_that_changes_under_the_agent_keeps_every_allocation_exact() {
    require_root();
    let f = fixtures();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hostile_python.py");
    let cmd = format!("/usr/bin/python3.11 {} {} threads", script.display(), f.libcuda.display());
    let t = trace(&["-c", &cmd], &[("GPUMEM_STEPS", "20")]);
    assert!(t.status.success(), "{}", t.stderr);
    let pid = single_pid(&t);
    let allocs = t.of_type("alloc");
    let (main, workers): (Vec<&Value>, Vec<&Value>) = allocs.iter().partition(|a| a["size"] == 1024 * 1024);
    assert_eq!(main.len(), 20);
    assert_eq!(workers.len(), 160, "8 threads a step, each one allocation");
    assert_eq!(t.of_type("free").len(), 180);
    // The main thread's frames stay walked while threads come and go.
    for a in &main {
        let frames = python_frames(a);
        assert!(frames.iter().any(|f| f.0 == "step") && frames.last().map(|f| f.0.as_str()) == Some("<module>"), "{a}");
    }
    assert!(t.summary["degraded"].as_array().is_none_or(|d| d.is_empty()), "{:#}", t.summary);
    let exit = t.of_type("exit").into_iter().find(|e| e["pid"] == pid).expect("exit event");
    assert!(released(exit).is_empty(), "{exit}");
}

/// The file offset of an ELF64 file's section `name`.
fn section_offset(elf: &[u8], name: &str) -> usize {
    let word = |at: usize, n: usize| elf[at..at + n].iter().rev().fold(0usize, |v, &b| v << 8 | b as usize);
    let (shoff, shentsize, shnum, shstrndx) = (word(0x28, 8), word(0x3a, 2), word(0x3c, 2), word(0x3e, 2));
    let header = |i: usize| shoff + i * shentsize;
    let names = word(header(shstrndx) + 0x18, 8);
    (0..shnum)
        .find(|&i| {
            let at = names + word(header(i), 4);
            elf[at..].split(|&b| b == 0).next() == Some(name.as_bytes())
        })
        .map(|i| word(header(i) + 0x18, 8))
        .unwrap_or_else(|| panic!("no {name} section"))
}

#[test]
fn a_libc10_cuda_whose_note_aims_its_semaphore_outside_the_file_is_refused_and_the_driver_bytes_stay_exact() {
    require_root();
    let f = fixtures();
    // PyTorch's allocator library, its first USDT note's semaphore moved
    // past every segment (the kernel would increment a counter there in
    // every process mapping the file).
    let dir = f.dir.join("hostile/bad-notes");
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libc10_cuda.so");
    let mut elf = std::fs::read(&f.torch).unwrap();
    let note = section_offset(&elf, ".note.stapsdt");
    // namesz, descsz, type, "stapsdt\0", then pc, base, semaphore.
    assert_eq!(&elf[note + 12..note + 20], b"stapsdt\0");
    let semaphore = note + 20 + 16;
    elf[semaphore..semaphore + 8].copy_from_slice(&0x7fff_0000_0000u64.to_le_bytes());
    let _ = std::fs::remove_file(&lib);
    std::fs::write(&lib, &elf).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/torch_train.py");
    let cmd = format!("python3 {} {} {}", script.display(), f.libcuda.display(), lib.display());
    let t = trace(&["-c", &cmd], &[("GPUMEM_TORCH", "leak"), ("GPUMEM_HOLD", "0")]);
    assert!(t.status.success(), "{}", t.stderr);
    assert!(
        t.stderr.contains("allocator probes not attached") && t.stderr.contains("its semaphore 0x7fff00000000 is in no writable segment"),
        "{}",
        t.stderr
    );
    assert!(t.of_type("tensor_alloc").is_empty(), "no probe at a forged offset");
    // The driver's side stays exact: what the allocator reserved is what its exit released.
    let own = figures(&t.stderr);
    let pid = single_pid(&t);
    let released: u64 = t.released_at_exit(pid).iter().map(|r| r.1).sum();
    assert_eq!(released, own["reserved"].as_u64().unwrap(), "{}", t.stderr);
}

#[test]
fn a_tenant_that_maps_many_libcuda_copies_gets_its_budget_and_another_tenant_stays_exact() {
    require_root();
    let f = fixtures();
    // Ten copies (ten inodes) loaded by one process of another user.
    let copies: Vec<std::path::PathBuf> = (0..10).map(|i| libcuda_under(format!("copies/{i}").as_bytes())).collect();
    let loader = "import ctypes, sys, time\n\
        libs = [ctypes.CDLL(p) for p in sys.argv[1:]]\n\
        print('loaded', flush=True)\n\
        time.sleep(3)\n";
    let (agent, stderr) = start_agent(&["--duration", "7"]);
    let mut tenant = std::process::Command::new("/usr/bin/python3.11");
    std::os::unix::process::CommandExt::uid(&mut tenant, 65534);
    let mut tenant = tenant.args(["-c", loader]).args(&copies).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut said_loaded = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(tenant.stdout.take().unwrap()), &mut said_loaded).unwrap();
    assert_eq!(said_loaded.trim(), "loaded");
    // Another tenant (root, the host's copy): attached and exact.
    let st =
        std::process::Command::new(&f.workload).arg(&f.libcuda).arg("late_load").env("GPUMEM_WORKLOAD_DELAY_MS", "1500").status().unwrap();
    assert!(st.success());
    let tenant_pid = u64::from(tenant.id());
    let _ = tenant.wait();
    let (lines, said) = finish_agent(agent, stderr);
    let attached = said.lines().filter(|l| l.contains("hostile/copies/") && l.contains("attached 61 of 62")).count();
    let refused = said.lines().filter(|l| l.contains("hostile/copies/") && l.contains("has 8 libcuda copies attached")).count();
    assert_eq!((attached, refused), (8, 2), "{said}");
    let summary = lines.iter().find(|e| e["type"] == "summary").expect("a summary");
    let degraded: Vec<&Value> = summary["degraded"].as_array().into_iter().flatten().filter(|d| d["pid"] == tenant_pid).collect();
    assert_eq!(degraded.len(), 1, "one entry per process and reason: {summary:#}");
    assert_eq!(degraded[0]["reason"], "libcuda_copies");
    let pid =
        lines.iter().find(|e| e["type"] == "init").and_then(|e| e["pid"].as_u64()).unwrap_or_else(|| panic!("no cuInit traced: {said}"));
    let allocs: Vec<&Value> = lines.iter().filter(|e| e["type"] == "alloc" && e["pid"] == pid).collect();
    assert_eq!(sizes(&allocs), [8 * MIB, 4 * MIB], "{said}");
}
