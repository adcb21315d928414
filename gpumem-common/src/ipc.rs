//! The 64 bytes that carry a shared allocation from its exporter to its
//! importers (`CUipcMemHandle`, `CUmemPoolPtrExportData`), folded into one
//! key by both sides' probes: the exporter's return and the importer's
//! call see the same bytes, so the same key joins them.

/// Bytes of a CUipcMemHandle (CU_IPC_HANDLE_SIZE) and of a CUmemPoolPtrExportData.
pub const HANDLE_BYTES: usize = 64;

/// FNV-1a over the handle's eight words: cheap enough for a probe,
/// and two live handles never meet by chance in 64 bits.
#[inline(always)]
pub fn key(words: &[u64; HANDLE_BYTES / 8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < words.len() {
        h = (h ^ words[i]).wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    // 0 means "no key" in events.
    if h == 0 {
        1
    } else {
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_bytes_give_the_same_key_and_one_word_changes_it() {
        let a = [1, 2, 3, 4, 5, 6, 7, 8];
        let mut b = a;
        assert_eq!(key(&a), key(&b));
        b[7] ^= 1;
        assert_ne!(key(&a), key(&b));
        assert_ne!(key(&[0; 8]), 0, "0 is \"no key\"");
    }
}
