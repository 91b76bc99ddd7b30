//! Finding the first byte of a kind eight bytes at a time: a word without one — most of a
//! document — is passed with a few instructions, and only a word that may hold one is looked
//! at byte by byte. The envelope reader looks for control characters this way, the fetch
//! answer (`json_text`) for bytes JSON must escape. Here, in the wire room, because the
//! reader may import nothing outside it (std, quick-xml, chrono).

const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);

/// Whether some byte of `word` is below `n` (at most 0x80). Exact as a whole: no borrow
/// crosses a byte unless that byte is below `n`.
pub fn some_byte_below(word: u64, n: u8) -> bool {
    word.wrapping_sub(ONES * u64::from(n)) & !word & HIGHS != 0
}

/// Whether some byte of `word` is `b`.
pub fn some_byte_is(word: u64, b: u8) -> bool {
    some_byte_below(word ^ (ONES * u64::from(b)), 1)
}

/// Where the first byte of `bytes` that `is` is: `may_hold` tells of each word of eight bytes
/// (native order) whether it can hold one, and must never say no to a word that does.
pub fn first_byte(
    bytes: &[u8],
    may_hold: impl Fn(u64) -> bool,
    is: impl Fn(u8) -> bool,
) -> Option<usize> {
    let mut words = bytes.chunks_exact(8);
    let mut at = 0;
    for word in words.by_ref() {
        let mut lanes = [0u8; 8];
        lanes.copy_from_slice(word);
        if may_hold(u64::from_ne_bytes(lanes))
            && let Some(i) = word.iter().position(|&b| is(b))
        {
            return Some(at + i);
        }
        at += 8;
    }
    words
        .remainder()
        .iter()
        .position(|&b| is(b))
        .map(|i| at + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_word_tests_agree_with_the_bytes_for_every_byte_in_every_lane() {
        for lane in 0..8 {
            for b in 0..=u8::MAX {
                // The other lanes hold a byte that is neither below 0x20 nor 0x22 nor 0xff.
                let mut lanes = [b'a'; 8];
                lanes[lane] = b;
                let word = u64::from_ne_bytes(lanes);
                assert_eq!(
                    some_byte_below(word, 0x20),
                    b < 0x20,
                    "{b:#x} in lane {lane}"
                );
                assert_eq!(some_byte_is(word, b'"'), b == b'"', "{b:#x} in lane {lane}");
                assert_eq!(some_byte_is(word, 0xff), b == 0xff, "{b:#x} in lane {lane}");
            }
        }
    }
}
