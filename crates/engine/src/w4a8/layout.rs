//! Where a group's values sit for the kernels: one order for the activations, and the code bytes
//! of every packing laid out to match it, so that one quantized activation row serves every width.
//!
//! A CQ group is [`GROUP`] values. The activations hold a group in *lane order*: the even positions
//! first, then the odd ones (`lane(i) = (i % 2)·64 + i / 2`). That is the order in which the
//! `.cact`'s 4-bit codes fall out of their bytes: byte `k` holds value `2k` in its low nibble and
//! value `2k + 1` in its high one, so the low nibbles of a run of bytes are a run of lanes, and so
//! are the high nibbles, 64 lanes further on. A kernel masks (and shifts) a register of code bytes
//! and gets a register of codes whose activations are one contiguous load: no shuffle of the
//! codes, no copy of the file's bytes in another order.

use crate::quant::{Bits, GROUP};

/// Half a group: where the odd positions start in lane order.
const HALF: usize = GROUP / 2;

/// The lane of a group's `i`-th value: the evens first, then the odds.
pub fn lane(i: usize) -> usize {
    (i % 2) * HALF + i / 2
}

/// The group position whose value sits in lane `l` (the inverse of [`lane`]).
pub fn position(l: usize) -> usize {
    2 * (l % HALF) + l / HALF
}

/// One bit field of the code bytes: code byte `k` of a group holds, `shift` bits up, the code of
/// lane `base + k`.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub shift: u32,
    pub base: usize,
}

/// How a matrix's codes are packed for the kernels: every group in `group_bytes` bytes, each byte
/// holding one code per [`Field`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    /// Two 4-bit codes a byte, lanes `k` and `64 + k`: the `.cact`'s own 4-bit bytes. 3-bit codes
    /// are repacked to this once, as they load (a 3-bit code straddles bytes).
    Nibbles,
    /// Four 2-bit codes a byte, lanes `k`, `64 + k`, `32 + k` and `96 + k`: 2-bit and ternary
    /// codes, reordered once as they load (the file packs positions `4k … 4k + 3` into byte `k`).
    Crumbs,
}

const NIBBLE_FIELDS: [Field; 2] = [Field { shift: 0, base: 0 }, Field { shift: 4, base: HALF }];
const CRUMB_FIELDS: [Field; 4] = [
    Field { shift: 0, base: 0 },
    Field { shift: 2, base: HALF },
    Field { shift: 4, base: HALF / 2 },
    Field { shift: 6, base: HALF + HALF / 2 },
];

impl Packing {
    /// The packing a CQ width is multiplied in.
    pub fn of(bits: Bits) -> Self {
        match bits {
            Bits::Four | Bits::Three => Packing::Nibbles,
            Bits::Two | Bits::Ternary => Packing::Crumbs,
        }
    }

    /// The fields of each code byte.
    pub fn fields(self) -> &'static [Field] {
        match self {
            Packing::Nibbles => &NIBBLE_FIELDS,
            Packing::Crumbs => &CRUMB_FIELDS,
        }
    }

    /// Bits of one code.
    pub fn code_bits(self) -> u32 {
        8 / self.fields().len() as u32
    }

    /// The mask of one code, shifted down.
    pub fn mask(self) -> u8 {
        (1u8 << self.code_bits()) - 1
    }

    /// Code bytes of one group.
    pub fn group_bytes(self) -> usize {
        GROUP / self.fields().len()
    }

    /// The codes of one group's bytes, in lane order.
    #[inline(always)]
    pub fn unpack(self, codes: &[u8], out: &mut [u8; GROUP]) {
        let mask = self.mask();
        for field in self.fields() {
            for (o, &b) in out[field.base..].iter_mut().zip(&codes[..self.group_bytes()]) {
                *o = (b >> field.shift) & mask;
            }
        }
    }

    /// Appends one group's codes, given in position order, as this packing's bytes.
    pub fn pack(self, codes: &[u8], out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + self.group_bytes(), 0);
        for field in self.fields() {
            for (k, byte) in out[start..].iter_mut().enumerate() {
                *byte |= codes[position(field.base + k)] << field.shift;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_are_a_permutation_evens_then_odds() {
        let lanes: Vec<usize> = (0..GROUP).map(lane).collect();
        assert_eq!(lanes[..4], [0, 64, 1, 65]);
        assert!((0..GROUP).all(|l| lane(position(l)) == l));
    }

    /// Every lane is filled by exactly one field of one byte, and packing then unpacking puts each
    /// position's code in its lane.
    #[test]
    fn each_packing_fills_every_lane_once_and_round_trips() {
        for packing in [Packing::Nibbles, Packing::Crumbs] {
            let mut filled = [0u8; GROUP];
            for field in packing.fields() {
                filled[field.base..field.base + packing.group_bytes()].iter_mut().for_each(|f| *f += 1);
            }
            assert!(filled.iter().all(|&f| f == 1), "{packing:?}");
            let codes: Vec<u8> = (0..GROUP).map(|i| (i * 7 % 13) as u8 & packing.mask()).collect();
            let mut bytes = Vec::new();
            packing.pack(&codes, &mut bytes);
            assert_eq!(bytes.len(), packing.group_bytes());
            let mut lanes = [0u8; GROUP];
            packing.unpack(&bytes, &mut lanes);
            assert!((0..GROUP).all(|i| lanes[lane(i)] == codes[i]), "{packing:?}");
        }
    }

    /// Nibbles are the `.cact`'s 4-bit bytes: position `2k` low, `2k + 1` high.
    #[test]
    fn nibbles_are_the_files_four_bit_bytes() {
        let codes: Vec<u8> = (0..GROUP).map(|i| (i % 16) as u8).collect();
        let mut bytes = Vec::new();
        Packing::Nibbles.pack(&codes, &mut bytes);
        assert_eq!(bytes[..2], [0x10, 0x32]);
    }
}
