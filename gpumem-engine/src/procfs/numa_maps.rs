//! `/proc/PID/numa_maps`: how many of each mapping's pages sit on which
//! NUMA node. On coherent platforms (GH200, GB200) a GPU's own memory is a
//! NUMA node without CPUs, and memory a process got from malloc or mmap
//! migrates there with no driver call: this is how much of it a process
//! holds there. The process shapes its mappings; the kernel escapes a
//! file name's spaces, tabs, newlines and `=` (`seq_file_path(m, file,
//! "\n\t= ")`), so no name can forge a token.

use std::io::{BufRead as _, Read as _};

/// The most of one read: about 100 000 mappings of ordinary names (the
/// kernel's default map count limit is 65 530); a process with longer is
/// counted as cut and its figure is a lower bound.
const MAX_BYTES: u64 = 16 << 20;

/// The bytes on each of `nodes` in /proc/PID/numa_maps, read a line at a
/// time up to its bound, and whether it was cut there (its sums then leave
/// out the rest).
pub fn read(pid: u32, nodes: &[u32]) -> Option<(Vec<u64>, bool)> {
    let file = std::fs::File::open(format!("/proc/{pid}/numa_maps")).ok()?;
    let mut reader = std::io::BufReader::with_capacity(64 << 10, file.take(MAX_BYTES));
    let mut sums = NodeSums::new(nodes);
    let (mut line, mut read) = (Vec::new(), 0u64);
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(n) => read += n as u64,
            Err(_) => return None,
        }
        // A line the bound cut may have lost its counts or page size.
        if line.last() == Some(&b'\n') {
            sums.line(&line[..line.len() - 1]);
        }
    }
    Some((sums.bytes, read >= MAX_BYTES))
}

/// Bytes on each node in `nodes` (the same order), summed over every
/// mapping as `numastat -p` sums them: a file page mapped by several
/// processes counts in each.
pub fn bytes_on_nodes(text: &[u8], nodes: &[u32]) -> Vec<u64> {
    let mut sums = NodeSums::new(nodes);
    text.split(|&b| b == b'\n').for_each(|line| sums.line(line));
    sums.bytes
}

/// The sums of [`bytes_on_nodes`], fed one line at a time (a reader need
/// not hold the whole file).
pub struct NodeSums<'a> {
    nodes: &'a [u32],
    /// Bytes on each of `nodes`.
    pub bytes: Vec<u64>,
    pages: Vec<u64>,
}

impl<'a> NodeSums<'a> {
    pub fn new(nodes: &'a [u32]) -> Self {
        NodeSums { nodes, bytes: vec![0; nodes.len()], pages: vec![0; nodes.len()] }
    }

    /// One mapping's line. Its `N<node>=<pages>` count pages of its
    /// `kernelpagesize_kB` (4 for ordinary and transparent huge pages, the
    /// huge page size for hugetlbfs), which the kernel writes after them; a
    /// line without one (no pages, or cut) counts nothing.
    pub fn line(&mut self, line: &[u8]) {
        self.pages.iter_mut().for_each(|p| *p = 0);
        let mut page_kib = None;
        // The address and the policy come first; then `key=value` tokens.
        for token in line.split(|&b| b == b' ').skip(2) {
            let Some(eq) = token.iter().position(|&b| b == b'=') else { continue };
            let (key, value) = (&token[..eq], &token[eq + 1..]);
            if key == b"kernelpagesize_kB" {
                page_kib = number(value);
            } else if let Some(node) = key.strip_prefix(b"N").and_then(number) {
                if let (Some(i), Some(n)) = (self.nodes.iter().position(|&want| u64::from(want) == node), number(value)) {
                    self.pages[i] = self.pages[i].saturating_add(n);
                }
            }
        }
        let Some(page_bytes) = page_kib.map(|k| k.saturating_mul(1024)) else { return };
        for (total, p) in self.bytes.iter_mut().zip(&self.pages) {
            *total = total.saturating_add(p.saturating_mul(page_bytes));
        }
    }
}

/// A decimal number of at most 20 digits, nothing else.
fn number(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 20 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Grace Hopper process: node 0 is Grace's LPDDR5X, node 1 the
    /// GPU's HBM (a CPU-less node), with a file whose name holds escaped
    /// spaces and `=` that must not read as tokens, a hugetlbfs mapping,
    /// and a mapping with no pages (no counts, no page size).
    const GH200: &str = "\
aaaab0000000 default file=/usr/bin/python3.12 mapped=420 mapmax=3 N0=420 kernelpagesize_kB=64
aaaab1000000 default heap anon=2048 dirty=2048 N0=1024 N1=1024 kernelpagesize_kB=64
ffff80000000 bind:1 anon=32768 dirty=32768 active=0 N1=32768 kernelpagesize_kB=64
ffff90000000 default file=/data/a\\040N1=999999\\075x\\040kernelpagesize_kB=1048576 mapped=2 N0=2 kernelpagesize_kB=64
ffffa0000000 default file=/dev/hugepages/w huge dirty=2 N1=2 kernelpagesize_kB=524288
ffffb0000000 default
fffff0000000 default stack anon=3 dirty=3 N0=3 kernelpagesize_kB=64
";

    #[test]
    fn pages_on_each_node_are_summed_at_each_mappings_page_size() {
        let kib = 1024;
        let node1 = (1024 + 32768) * 64 * kib + 2 * 524288 * kib;
        let node0 = (420 + 1024 + 2 + 3) * 64 * kib;
        assert_eq!(bytes_on_nodes(GH200.as_bytes(), &[1, 0]), vec![node1, node0]);
        assert_eq!(bytes_on_nodes(GH200.as_bytes(), &[7]), vec![0], "a node no mapping names");
        assert_eq!(bytes_on_nodes(GH200.as_bytes(), &[]), Vec::<u64>::new());
    }

    #[test]
    fn this_processs_numa_maps_sums_as_its_lines_say() {
        // All of a process's pages are on some node: node 0 on a one-node
        // machine, and never more than the address space it maps.
        let nodes: Vec<u32> = (0..64).collect();
        let (bytes, cut) = read(std::process::id(), &nodes).expect("own numa_maps (a kernel without CONFIG_NUMA has none)");
        let total: u64 = bytes.iter().sum();
        let mapped: u64 = crate::procfs::read_maps(std::process::id()).unwrap().iter().map(|m| m.range.end - m.range.start).sum();
        assert!(!cut && total > 0 && total <= mapped, "{total} bytes on nodes of {mapped} mapped");
        assert_eq!(read(std::process::id(), &[]), Some((vec![], false)));
        assert_eq!(read(u32::MAX, &nodes), None, "no such process");
    }

    #[test]
    fn damaged_lines_count_nothing_and_huge_counts_saturate() {
        let text = b"1 default N1=5\n2 default N1=x kernelpagesize_kB=4\n3 default N1=-1 kernelpagesize_kB=4\n\
            4 default N1=18446744073709551615 kernelpagesize_kB=18446744073709551615\n5 default N1=1 kernelpagesize_kB=4";
        assert_eq!(bytes_on_nodes(text, &[1]), vec![u64::MAX]);
        let text = b"1 default N1=5\n2 default N1=3 kernelpagesize_kB=4 N1=2";
        assert_eq!(bytes_on_nodes(text, &[1]), vec![5 * 4096], "no page size: nothing; a count after it still counts");
    }
}
