//! compressed-tensors `pack_to_int32`: eight 4-bit values per little-endian i32, offset binary `u = q + 8`,
//! element `j` of a row in bits `4·(j%8)..4·(j%8)+3` of word `j/8` (first element in the lowest nibble).

/// Number of i32 words holding `columns` 4-bit values.
pub fn packed_columns(columns: usize) -> usize {
    columns.div_ceil(8)
}

/// Packs signed 4-bit values (each in [-8, 7]) of one row; a partial last word is padded with
/// zero nibbles, as compressed-tensors pads after adding the offset.
pub fn pack_row(values: &[i8], out: &mut [u32]) {
    debug_assert_eq!(out.len(), packed_columns(values.len()));
    let full = values.len() / 8;
    for (word, chunk) in out.iter_mut().zip(values.chunks_exact(8)) {
        *word = pack_eight(chunk.try_into().expect("chunks_exact gives eight"));
    }
    let tail = &values[full * 8..];
    if !tail.is_empty() {
        let mut packed = 0u32;
        for (position, &q) in tail.iter().enumerate() {
            packed |= (((q + 8) as u32) & 0xF) << (4 * position);
        }
        out[full] = packed;
    }
}

/// Eight values into one word with a few 64-bit operations: `(q + 8) mod 16` is the low nibble of `q` with its
/// top bit flipped, done for all eight bytes at once; then fold neighbouring bytes into nibbles, pairs into bytes, quads into the word.
#[inline(always)]
fn pack_eight(values: &[i8; 8]) -> u32 {
    let bytes = (u64::from_le_bytes(values.map(|v| v as u8)) & 0x0F0F_0F0F_0F0F_0F0F) ^ 0x0808_0808_0808_0808;
    let nibbles = (bytes | (bytes >> 4)) & 0x00FF_00FF_00FF_00FF;
    let pairs = (nibbles | (nibbles >> 8)) & 0x0000_FFFF_0000_FFFF;
    (pairs | (pairs >> 16)) as u32
}

/// The signed 4-bit value in nibble `position` (0…7) of `word`.
#[inline(always)]
pub fn code(word: u32, position: usize) -> i8 {
    ((word >> (4 * position)) & 0xF) as i8 - 8
}

/// Unpacks `columns` signed 4-bit values of one row.
pub fn unpack_row(words: &[u32], columns: usize, out: &mut [i8]) {
    debug_assert_eq!(out.len(), columns);
    for (j, value) in out.iter_mut().enumerate() {
        *value = code(words[j / 8], j % 8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn packs_the_compressed_tensors_example() {
        let mut out = [0u32; 1];
        pack_row(&[-8, -7, -1, 0, 1, 2, 3, 7], &mut out);
        assert_eq!(out[0], 0xfba9_8710);
        pack_row(&[-8, 7, 2, 2, 0, 0, 3, -2], &mut out);
        assert_eq!(out[0], 0x6b88_aaf0);
    }

    proptest! {
        #[test]
        fn pack_unpack_round_trips(values in proptest::collection::vec(-8i8..=7, 1..100)) {
            let mut words = vec![0u32; packed_columns(values.len())];
            pack_row(&values, &mut words);
            let mut back = vec![0i8; values.len()];
            unpack_row(&words, values.len(), &mut back);
            prop_assert_eq!(back, values);
        }
    }
}
