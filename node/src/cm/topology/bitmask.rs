//! A set of NUMA node ids as one word (upstream
//! `pkg/kubelet/cm/topologymanager/bitmask/bitmask.go`): merging hints is then an AND, and
//! "narrower" is fewer bits, then the smaller number (the lower nodes).

/// NUMA node ids `0..64` as bits of a `u64` (upstream's `bitMask uint64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BitMask(u64);

/// The most bits a mask holds (upstream's `uint64`).
pub const MAX_BITS: u32 = 64;

impl BitMask {
    /// No node.
    pub const EMPTY: BitMask = BitMask(0);

    /// This mask with `bit` set too (an id of 64 or more is left out: the machine's
    /// topology refuses such ids when it is read).
    pub fn with(self, bit: u32) -> BitMask {
        if bit >= MAX_BITS {
            return self;
        }
        BitMask(self.0 | (1 << bit))
    }

    /// The mask of `bits`; an id of 64 or more is refused (`NewBitMask`'s "bit number must be
    /// less than 64").
    pub fn new(bits: &[u32]) -> Result<BitMask, String> {
        let mut m = 0u64;
        for &b in bits {
            if b >= MAX_BITS {
                return Err(format!("bit number must be less than {MAX_BITS}"));
            }
            m |= 1 << b;
        }
        Ok(BitMask(m))
    }

    /// The raw word.
    pub fn value(self) -> u64 {
        self.0
    }

    /// How many bits are set (`Count`).
    pub fn count(self) -> u32 {
        self.0.count_ones()
    }

    /// The set bits, lowest first (`GetBits`).
    pub fn bits(self) -> Vec<u32> {
        (0..MAX_BITS).filter(|b| self.0 & (1 << b) != 0).collect()
    }

    /// Whether `bit` is set.
    pub fn is_set(self, bit: u32) -> bool {
        bit < MAX_BITS && self.0 & (1 << bit) != 0
    }

    /// `And(first, masks...)`.
    pub fn and(self, other: BitMask) -> BitMask {
        BitMask(self.0 & other.0)
    }

    /// `IsNarrowerThan`: fewer bits, or as many and a smaller number.
    pub fn is_narrower_than(self, other: BitMask) -> bool {
        if self.count() == other.count() {
            return self.0 < other.0;
        }
        self.count() < other.count()
    }
}

/// Calls `f` with every non-empty subset of `bits` as a mask, smallest subsets first
/// (`IterateBitMasks`).
pub fn iterate_bitmasks(bits: &[u32], mut f: impl FnMut(BitMask)) {
    fn rec(bits: &[u32], start: usize, size: usize, acc: u64, f: &mut dyn FnMut(BitMask)) {
        if size == 0 {
            f(BitMask(acc));
            return;
        }
        for i in start..bits.len() {
            rec(bits, i + 1, size - 1, acc | (1 << bits[i]), f);
        }
    }
    for size in 1..=bits.len() {
        rec(bits, 0, size, 0, &mut f);
    }
}

impl std::fmt::Display for BitMask {
    /// The ids as a list (`[0 1]`, klog's form in upstream's log lines).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bits: Vec<String> = self.bits().iter().map(u32::to_string).collect();
        write!(f, "[{}]", bits.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(bits: &[u32]) -> BitMask {
        BitMask::new(bits).expect("mask")
    }

    #[test]
    fn narrower_is_fewer_bits_then_lower_nodes() {
        assert!(m(&[0]).is_narrower_than(m(&[0, 1])));
        assert!(m(&[0]).is_narrower_than(m(&[1])));
        assert!(!m(&[1]).is_narrower_than(m(&[0])));
        assert!(m(&[0, 1]).is_narrower_than(m(&[0, 2])));
        assert_eq!(m(&[0, 1]).and(m(&[1, 2])), m(&[1]));
        assert_eq!(m(&[0, 3]).bits(), vec![0, 3]);
        assert!(BitMask::new(&[64]).is_err());
    }

    #[test]
    fn iterates_every_subset_smallest_first() {
        let mut seen = Vec::new();
        iterate_bitmasks(&[0, 1, 2], |b| seen.push(b.bits()));
        assert_eq!(
            seen,
            vec![
                vec![0],
                vec![1],
                vec![2],
                vec![0, 1],
                vec![0, 2],
                vec![1, 2],
                vec![0, 1, 2]
            ]
        );
    }
}
