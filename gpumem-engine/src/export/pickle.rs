//! A Python pickle writer (protocol 2) for plain data: dicts, lists,
//! tuples, str, int, float, bool and None, written as a stream of opcodes.
//! Objects can be memoized and referred to again (a stack's frames, shared
//! by a hundred thousand trace entries, are written once): serde-pickle
//! cannot do that, and the file would repeat every stack.
pub struct Pickler {
    out: Vec<u8>,
    memo: u32,
}

mod op {
    pub const PROTO: u8 = 0x80;
    pub const STOP: u8 = b'.';
    pub const MARK: u8 = b'(';
    pub const EMPTY_DICT: u8 = b'}';
    pub const SETITEMS: u8 = b'u';
    pub const EMPTY_LIST: u8 = b']';
    pub const APPENDS: u8 = b'e';
    pub const TUPLE: u8 = b't';
    pub const BINUNICODE: u8 = b'X';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const BININT2: u8 = b'M';
    pub const LONG1: u8 = 0x8a;
    pub const BINFLOAT: u8 = b'G';
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const NONE: u8 = b'N';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const BINGET: u8 = b'h';
    pub const LONG_BINGET: u8 = b'j';
}

/// A memoized object, to be written again with `Pickler::get`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memo(u32);

impl Default for Pickler {
    fn default() -> Self {
        Pickler { out: vec![op::PROTO, 2], memo: 0 }
    }
}

impl Pickler {
    /// A dict: its keys and values follow, then `end_dict`.
    pub fn dict(&mut self) {
        self.out.extend([op::EMPTY_DICT, op::MARK]);
    }
    pub fn end_dict(&mut self) {
        self.out.push(op::SETITEMS);
    }
    /// A list: its items follow, then `end_list`.
    pub fn list(&mut self) {
        self.out.extend([op::EMPTY_LIST, op::MARK]);
    }
    pub fn end_list(&mut self) {
        self.out.push(op::APPENDS);
    }
    /// A tuple: its items follow, then `end_tuple`.
    pub fn tuple(&mut self) {
        self.out.push(op::MARK);
    }
    pub fn end_tuple(&mut self) {
        self.out.push(op::TUPLE);
    }

    pub fn str(&mut self, s: &str) {
        self.out.push(op::BINUNICODE);
        self.out.extend((s.len() as u32).to_le_bytes());
        self.out.extend(s.as_bytes());
    }

    pub fn int(&mut self, v: i128) {
        match v {
            0..=0xff => self.out.extend([op::BININT1, v as u8]),
            0x100..=0xffff => {
                self.out.push(op::BININT2);
                self.out.extend((v as u16).to_le_bytes());
            }
            _ if i32::try_from(v).is_ok() => {
                self.out.push(op::BININT);
                self.out.extend((v as i32).to_le_bytes());
            }
            _ => {
                // LONG1: little-endian two's complement, as few bytes as keep the sign.
                let bytes = v.to_le_bytes();
                let mut n = bytes.len();
                while n > 1 {
                    let (top, next) = (bytes[n - 1], bytes[n - 2]);
                    let redundant = (top == 0 && next & 0x80 == 0) || (top == 0xff && next & 0x80 != 0);
                    if !redundant {
                        break;
                    }
                    n -= 1;
                }
                self.out.extend([op::LONG1, n as u8]);
                self.out.extend(&bytes[..n]);
            }
        }
    }

    pub fn uint(&mut self, v: u64) {
        self.int(v as i128);
    }

    pub fn float(&mut self, v: f64) {
        self.out.push(op::BINFLOAT);
        self.out.extend(v.to_be_bytes());
    }

    pub fn bool(&mut self, v: bool) {
        self.out.push(if v { op::NEWTRUE } else { op::NEWFALSE });
    }

    pub fn none(&mut self) {
        self.out.push(op::NONE);
    }

    /// Remembers the object just written (a finished dict, list, ...).
    pub fn memoize(&mut self) -> Memo {
        let i = self.memo;
        self.memo += 1;
        self.indexed(op::BINPUT, op::LONG_BINPUT, i);
        Memo(i)
    }

    /// The memoized object again (the same object, not a copy).
    pub fn get(&mut self, m: Memo) {
        self.indexed(op::BINGET, op::LONG_BINGET, m.0);
    }

    /// A memo opcode with its index: one byte where it fits, else four.
    fn indexed(&mut self, short: u8, long: u8, i: u32) {
        match u8::try_from(i) {
            Ok(b) => self.out.extend([short, b]),
            Err(_) => {
                self.out.push(long);
                self.out.extend(i.to_le_bytes());
            }
        }
    }

    /// A `key: value` entry of a dict whose value is a str.
    pub fn entry_str(&mut self, key: &str, value: &str) {
        self.str(key);
        self.str(value);
    }

    /// A `key: value` entry of a dict whose value is an int.
    pub fn entry_int(&mut self, key: &str, value: i128) {
        self.str(key);
        self.int(value);
    }

    /// The pickle: the objects written, which must be exactly one.
    pub fn finish(mut self) -> Vec<u8> {
        self.out.push(op::STOP);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::Write as _,
        process::{Command, Stdio},
    };

    use super::*;

    /// What Python makes of a pickle: `repr` of the loaded object.
    fn python_repr(pickle: &[u8]) -> String {
        let mut child = Command::new("python3")
            .args([
                "-c",
                "import pickle,sys; o=pickle.loads(sys.stdin.buffer.read()); print(repr(o)); print(o['shared'][0] is o['shared'][1])",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        child.stdin.take().unwrap().write_all(pickle).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn memo_indexes_past_one_byte_are_read_back() {
        // 300 memoized lists: the last ones need LONG_BINPUT / LONG_BINGET.
        let mut p = Pickler::default();
        p.dict();
        p.str("shared");
        p.list();
        let mut memos = Vec::new();
        for i in 0..300 {
            p.list();
            p.int(i);
            p.end_list();
            memos.push(p.memoize());
        }
        p.get(memos[299]);
        p.end_list();
        p.end_dict();
        let mut child = Command::new("python3")
            .args(["-c", "import pickle,sys; s=pickle.loads(sys.stdin.buffer.read())['shared']; print(len(s), s[300], s[299] is s[300])"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        child.stdin.take().unwrap().write_all(&p.finish()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), "301 [299] True\n");
    }

    #[test]
    fn python_reads_every_kind_of_value_and_shared_objects() {
        let mut p = Pickler::default();
        p.dict();
        p.str("ints");
        p.list();
        for v in [0, 255, 256, 65535, 65536, -1, i32::MIN as i128, 0x7f12_3456_7000, -(1 << 40), u64::MAX as i128] {
            p.int(v);
        }
        p.end_list();
        p.entry_str("text", "é ✓");
        p.str("misc");
        p.tuple();
        p.float(1.5);
        p.bool(true);
        p.bool(false);
        p.none();
        p.end_tuple();
        p.str("shared");
        p.list();
        p.list();
        p.int(7);
        p.end_list();
        let m = p.memoize();
        p.get(m);
        p.end_list();
        p.end_dict();
        let got = python_repr(&p.finish());
        assert_eq!(
            got,
            "{'ints': [0, 255, 256, 65535, 65536, -1, -2147483648, 139716164218880, -1099511627776, 18446744073709551615], \
             'text': 'é ✓', 'misc': (1.5, True, False, None), 'shared': [[7], [7]]}\nTrue\n"
        );
    }
}
