//! A heap profile as pprof's `profile.proto`, gzipped: what `go tool
//! pprof`, Grafana Pyroscope and Parca read. Sample types as Go's heap
//! profiles (`alloc_objects`, `alloc_space`, `inuse_objects`,
//! `inuse_space`, `inuse_space` by default), one sample per (process,
//! device, stack), string labels for who and where.
use std::{collections::HashMap, io::Write as _};

use prost::Message;

use crate::{analysis::profile::HeapProfile, stacks::Frame};

/// profile.proto's messages (github.com/google/pprof/proto/profile.proto),
/// the fields gpumem writes.
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
    }
}

/// Each module's mapping gets an address range of its own this wide: a
/// frame's address is its mapping's start plus its offset in the file.
const MAPPING_SPAN: u64 = 1 << 40;

/// What the profile says about itself besides the samples.
pub struct Meta {
    /// CLOCK_REALTIME nanoseconds at the profile's end, and its length.
    pub time_ns: i64,
    pub duration_ns: i64,
    pub comments: Vec<String>,
}

#[derive(Default)]
struct Builder {
    profile: proto::Profile,
    strings: HashMap<String, i64>,
    mappings: HashMap<String, u64>,
    functions: HashMap<(String, String), u64>,
    /// (mapping, address) for native frames; (function, line) for Python's.
    locations: HashMap<(u64, u64, u64), u64>,
}

impl Builder {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn value_type(&mut self, t: &str, unit: &str) -> proto::ValueType {
        proto::ValueType { r#type: self.string(t), unit: self.string(unit) }
    }

    fn mapping(&mut self, module: &str) -> u64 {
        if let Some(&id) = self.mappings.get(module) {
            return id;
        }
        let id = self.profile.mapping.len() as u64 + 1;
        let filename = self.string(module);
        self.profile.mapping.push(proto::Mapping {
            id,
            memory_start: id * MAPPING_SPAN,
            memory_limit: (id + 1) * MAPPING_SPAN,
            file_offset: 0,
            filename,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
        });
        self.mappings.insert(module.to_string(), id);
        id
    }

    fn function(&mut self, name: &str, file: &str) -> u64 {
        let key = (name.to_string(), file.to_string());
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        let (n, f) = (self.string(name), self.string(file));
        self.profile.function.push(proto::Function { id, name: n, system_name: n, filename: f });
        self.functions.insert(key, id);
        id
    }

    fn location(&mut self, frame: &Frame) -> u64 {
        let function = self.function(&frame.name(), frame.file.as_deref().unwrap_or(""));
        let line = frame.line.unwrap_or(0) as u64;
        if frame.python {
            // A Python frame has no address of its own: it is its code and line.
            return self.intern_location((0, function, line), 0, 0, function, line);
        }
        let mapping = self.mapping(&frame.module);
        let address = mapping * MAPPING_SPAN + frame.module_offset.min(MAPPING_SPAN - 1);
        self.intern_location((mapping, address, 0), mapping, address, function, line)
    }

    /// The location of samples whose stack was not captured (not sampled
    /// over the budget, not taken for pinned host memory, or unwinding failed).
    fn unknown_location(&mut self) -> u64 {
        let function = self.function("[stack not captured]", "");
        self.intern_location((0, function, 0), 0, 0, function, 0)
    }

    /// The location `key` stands for, added the first time.
    fn intern_location(&mut self, key: (u64, u64, u64), mapping_id: u64, address: u64, function: u64, line: u64) -> u64 {
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        let line = vec![proto::Line { function_id: function, line: line as i64 }];
        self.profile.location.push(proto::Location { id, mapping_id, address, line });
        self.locations.insert(key, id);
        id
    }
}

/// The device label: `GPU-0`, `host` for pinned host memory, `unknown`.
pub fn device_label(device: i32, host: bool) -> String {
    match (host, device) {
        (true, _) => "host".to_string(),
        (false, d) if d < 0 => "unknown".to_string(),
        (false, d) => format!("GPU-{d}"),
    }
}

/// The profile, encoded and gzipped.
pub fn render(p: &HeapProfile, meta: &Meta) -> Vec<u8> {
    let mut b = Builder::default();
    b.string("");
    let types = [("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects", "count"), ("inuse_space", "bytes")];
    b.profile.sample_type = types.iter().map(|(t, u)| b.value_type(t, u)).collect();
    b.profile.default_sample_type = b.string("inuse_space");
    b.profile.period_type = Some(b.value_type("space", "bytes"));
    b.profile.period = p.sample_bytes as i64;
    b.profile.time_nanos = meta.time_ns;
    b.profile.duration_nanos = meta.duration_ns;
    b.profile.comment = meta.comments.iter().map(|c| b.string(c)).collect();
    for s in &p.samples {
        let mut location_id: Vec<u64> = s.frames.iter().map(|f| b.location(f)).collect();
        if location_id.is_empty() {
            // pprof shows no sample without a location: one that says why.
            location_id.push(b.unknown_location());
        }
        let mut labels = vec![
            ("pid", s.pid.to_string()),
            ("comm", s.comm.clone()),
            ("device", device_label(s.device, s.host)),
            ("layer", s.layer.name().to_string()),
        ];
        if let Some(c) = &s.container {
            labels.push(("container", c.clone()));
        }
        if let Some(pod) = &s.pod {
            labels.push(("pod", pod.clone()));
        }
        if s.estimated {
            labels.push(("estimated", "true".to_string()));
        }
        if s.stack.is_none() {
            labels.push(("stack", "not captured".to_string()));
        }
        let label = labels.into_iter().map(|(k, v)| proto::Label { key: b.string(k), str: b.string(&v) }).collect();
        b.profile.sample.push(proto::Sample {
            location_id,
            value: vec![s.alloc_objects, s.alloc_space, s.inuse_objects, s.inuse_space],
            label,
        });
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&b.profile.encode_to_vec()).expect("writing to memory");
    gz.finish().expect("writing to memory")
}
