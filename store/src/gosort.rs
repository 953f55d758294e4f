//! Go's `sort.Sort`, step for step, so that sorted ranges order ties exactly as etcd does.
//!
//! etcd 3.4 sorts a range's results (`etcdserver/apply.go`, `applierV3backend.Range`) with
//! `sort.Sort(sorter)` for ascending and `sort.Sort(sort.Reverse(sorter))` for descending
//! order, where `sorter` compares one field (version, create or mod revision, value). Ties are
//! common (every key written by one txn has the same mod and create revision), and `sort.Sort`
//! is not a stable sort, so the order of tied keys is whatever Go's algorithm leaves. Since
//! Go 1.19 (etcd 3.4.23 as Debian ships it is built with Go 1.19.8) that algorithm is
//! pattern-defeating quicksort (`src/sort/zsortinterface.go`: `pdqsort`, `partition`,
//! `partitionEqual`, `partialInsertionSort`, `breakPatterns`, `choosePivot`; `src/sort/sort.go`:
//! `Sort`, `xorshift`, `nextPowerOfTwo`). Its observable behaviour:
//!
//! - up to 12 elements it is an insertion sort, which is stable: tied keys stay in key order,
//!   in both orders (`sort.Reverse` swaps the comparison's arguments, it does not reverse the
//!   result, so a descending sort keeps ties in key order too);
//! - above 12 it partitions around chosen pivots and may move tied elements past each other;
//!   the permutation is deterministic (the "random" pattern breaker is seeded with the
//!   length), so it can be reproduced exactly, which is what this module does.
//!
//! Sorting ascending and reversing the result, as skerry did before, reverses every run of
//! ties instead. Every index computation below follows Go's, including a quirk of
//! `partialInsertionSort`, whose leftward shift stops at index 1 of the whole slice rather
//! than at the start of the range being sorted.

/// Ranges at most this long are insertion-sorted (Go's `maxInsertion`).
const INSERTION_MAX: usize = 12;
/// Ranges at least this long take the pivot as Tukey's ninther (Go's `shortestNinther`).
const NINTHER_MIN: usize = 50;
/// Comparisons-with-swap that mark a range as descending when choosing a pivot: all twelve
/// of the ninther's (Go's `maxSwaps`).
const PIVOT_SWAPS_MAX: usize = 4 * 3;
/// Out-of-order pairs `partialInsertionSort` fixes before it gives up (Go's `maxSteps`).
const PARTIAL_STEPS_MAX: usize = 5;
/// Ranges shorter than this are never shifted by `partialInsertionSort` (Go's
/// `shortestShifting`).
const PARTIAL_SHIFT_MIN: usize = 50;

/// What `choose_pivot` learned about the range's order (Go's `sortedHint`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Hint {
    Unknown,
    Increasing,
    Decreasing,
}

/// Sorts `v` as Go's `sort.Sort` would with `less` as the `Less` method: the same
/// comparisons and swaps in the same order, hence the same placement of elements that compare
/// equal. For `sort.Sort(sort.Reverse(x))`, pass `less` with its arguments swapped.
pub fn sort_like_go<T>(v: &mut [T], less: impl Fn(&T, &T) -> bool) {
    let n = v.len();
    if n <= 1 {
        return;
    }
    // Go's `bits.Len(uint(n))`: the bad-pivot allowance before falling back to heapsort.
    let limit = (usize::BITS - n.leading_zeros()) as usize;
    Sorter { v, less: &less }.pdqsort(0, n, limit);
}

struct Sorter<'a, T, F> {
    v: &'a mut [T],
    less: &'a F,
}

impl<T, F: Fn(&T, &T) -> bool> Sorter<'_, T, F> {
    fn less(&self, i: usize, j: usize) -> bool {
        (self.less)(&self.v[i], &self.v[j])
    }

    fn swap(&mut self, i: usize, j: usize) {
        self.v.swap(i, j);
    }

    fn insertion_sort(&mut self, a: usize, b: usize) {
        for i in a + 1..b {
            let mut j = i;
            while j > a && self.less(j, j - 1) {
                self.swap(j, j - 1);
                j -= 1;
            }
        }
    }

    /// Restores the heap property of `[lo, hi)`, offsets relative to `first`.
    fn sift_down(&mut self, lo: usize, hi: usize, first: usize) {
        let mut root = lo;
        loop {
            let mut child = 2 * root + 1;
            if child >= hi {
                return;
            }
            if child + 1 < hi && self.less(first + child, first + child + 1) {
                child += 1;
            }
            if !self.less(first + root, first + child) {
                return;
            }
            self.swap(first + root, first + child);
            root = child;
        }
    }

    fn heap_sort(&mut self, a: usize, b: usize) {
        let first = a;
        let hi = b - a;
        for i in (0..=(hi - 1) / 2).rev() {
            self.sift_down(i, hi, first);
        }
        for i in (0..hi).rev() {
            self.swap(first, first + i);
            self.sift_down(0, i, first);
        }
    }

    fn pdqsort(&mut self, mut a: usize, mut b: usize, mut limit: usize) {
        let mut was_balanced = true;
        let mut was_partitioned = true;
        loop {
            let length = b - a;
            if length <= INSERTION_MAX {
                self.insertion_sort(a, b);
                return;
            }
            if limit == 0 {
                self.heap_sort(a, b);
                return;
            }
            if !was_balanced {
                self.break_patterns(a, b);
                limit -= 1;
            }
            let (mut pivot, mut hint) = self.choose_pivot(a, b);
            if hint == Hint::Decreasing {
                self.reverse_range(a, b);
                pivot = (b - 1) - (pivot - a);
                hint = Hint::Increasing;
            }
            if was_balanced
                && was_partitioned
                && hint == Hint::Increasing
                && self.partial_insertion_sort(a, b)
            {
                return;
            }
            // Go compares with the element before the range (index a - 1 of the whole slice):
            // not smaller than the pivot means the range holds many copies of it.
            if a > 0 && !self.less(a - 1, pivot) {
                a = self.partition_equal(a, b, pivot);
                continue;
            }
            let (mid, already_partitioned) = self.partition(a, b, pivot);
            was_partitioned = already_partitioned;
            let (left, right) = (mid - a, b - mid);
            let balance_threshold = length / 8;
            if left < right {
                was_balanced = left >= balance_threshold;
                self.pdqsort(a, mid, limit);
                a = mid + 1;
            } else {
                was_balanced = right >= balance_threshold;
                self.pdqsort(mid + 1, b, limit);
                b = mid;
            }
        }
    }

    /// One partition around `pivot`: smaller elements before the returned index, the rest
    /// after it. Also says whether nothing had to move.
    fn partition(&mut self, a: usize, b: usize, pivot: usize) -> (usize, bool) {
        self.swap(a, pivot);
        // `i` and `j` bound the elements not yet placed, both inclusive. `j` never goes below
        // `a`: it only moves down while `i <= j` with `i > a`.
        let (mut i, mut j) = (a + 1, b - 1);
        while i <= j && self.less(i, a) {
            i += 1;
        }
        while i <= j && !self.less(j, a) {
            j -= 1;
        }
        if i > j {
            self.swap(j, a);
            return (j, true);
        }
        self.swap(i, j);
        i += 1;
        j -= 1;
        loop {
            while i <= j && self.less(i, a) {
                i += 1;
            }
            while i <= j && !self.less(j, a) {
                j -= 1;
            }
            if i > j {
                break;
            }
            self.swap(i, j);
            i += 1;
            j -= 1;
        }
        self.swap(j, a);
        (j, false)
    }

    /// Partitions a range holding nothing smaller than the pivot into the elements equal to
    /// it, then the greater ones; returns where the greater ones start.
    fn partition_equal(&mut self, a: usize, b: usize, pivot: usize) -> usize {
        self.swap(a, pivot);
        let (mut i, mut j) = (a + 1, b - 1);
        loop {
            while i <= j && !self.less(a, i) {
                i += 1;
            }
            while i <= j && self.less(a, j) {
                j -= 1;
            }
            if i > j {
                return i;
            }
            self.swap(i, j);
            i += 1;
            j -= 1;
        }
    }

    /// Fixes up to a few out-of-order neighbours; true if the range is then sorted.
    fn partial_insertion_sort(&mut self, a: usize, b: usize) -> bool {
        let mut i = a + 1;
        for _ in 0..PARTIAL_STEPS_MAX {
            while i < b && !self.less(i, i - 1) {
                i += 1;
            }
            if i == b {
                return true;
            }
            if b - a < PARTIAL_SHIFT_MIN {
                return false;
            }
            self.swap(i, i - 1);
            // The smaller one shifts left, down to index 1 of the whole slice (Go's bound,
            // not `a + 1`).
            if i - a >= 2 {
                let mut j = i - 1;
                while j >= 1 {
                    if !self.less(j, j - 1) {
                        break;
                    }
                    self.swap(j, j - 1);
                    j -= 1;
                }
            }
            // The greater one shifts right.
            if b - i >= 2 {
                for j in i + 1..b {
                    if !self.less(j, j - 1) {
                        break;
                    }
                    self.swap(j, j - 1);
                }
            }
        }
        false
    }

    /// Swaps three elements around the middle with pseudo-random others, to break patterns
    /// that make partitions unbalanced. Seeded with the length, so it is deterministic.
    fn break_patterns(&mut self, a: usize, b: usize) {
        let length = b - a;
        if length < 8 {
            return;
        }
        let mut random = XorShift(length as u64);
        // Go's `nextPowerOfTwo`: 1 << bits.Len(length).
        let modulus = 1usize << (usize::BITS - length.leading_zeros());
        let middle = a + (length / 4) * 2;
        for idx in middle - 1..=middle + 1 {
            let mut other = (random.next() as usize) & (modulus - 1);
            if other >= length {
                other -= length;
            }
            self.swap(idx, a + other);
        }
    }

    /// A pivot for `[a, b)`: the middle element below 8, the median of three below 50, Tukey's
    /// ninther above; with what the comparisons said about the range's order.
    fn choose_pivot(&mut self, a: usize, b: usize) -> (usize, Hint) {
        let l = b - a;
        let mut swaps = 0;
        let mut i = a + l / 4;
        let mut j = a + l / 4 * 2;
        let mut k = a + l / 4 * 3;
        if l >= 8 {
            if l >= NINTHER_MIN {
                i = self.median_adjacent(i, &mut swaps);
                j = self.median_adjacent(j, &mut swaps);
                k = self.median_adjacent(k, &mut swaps);
            }
            j = self.median(i, j, k, &mut swaps);
        }
        let hint = match swaps {
            0 => Hint::Increasing,
            PIVOT_SWAPS_MAX => Hint::Decreasing,
            _ => Hint::Unknown,
        };
        (j, hint)
    }

    /// `(x, y)` with `v[x] <= v[y]`, counting a swap when they were the other way round.
    fn order2(&self, a: usize, b: usize, swaps: &mut usize) -> (usize, usize) {
        if self.less(b, a) {
            *swaps += 1;
            (b, a)
        } else {
            (a, b)
        }
    }

    /// The index of the median of `v[a]`, `v[b]`, `v[c]`.
    fn median(&self, a: usize, b: usize, c: usize, swaps: &mut usize) -> usize {
        let (a, b) = self.order2(a, b, swaps);
        let (b, _c) = self.order2(b, c, swaps);
        let (_a, b) = self.order2(a, b, swaps);
        b
    }

    fn median_adjacent(&self, a: usize, swaps: &mut usize) -> usize {
        self.median(a - 1, a, a + 1, swaps)
    }

    fn reverse_range(&mut self, a: usize, b: usize) {
        let (mut i, mut j) = (a, b - 1);
        while i < j {
            self.swap(i, j);
            i += 1;
            j -= 1;
        }
    }
}

/// Go's `sort` package xorshift generator (shifts 13, 17, 5, as in Go 1.19's `sort.go`).
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(sort field, key)` pairs; sorting compares the field only, so the keys show where
    /// ties ended up.
    fn sorted(items: &[(i64, u32)], descending: bool) -> Vec<u32> {
        let mut v = items.to_vec();
        if descending {
            sort_like_go(&mut v, |a, b| b.0 < a.0);
        } else {
            sort_like_go(&mut v, |a, b| a.0 < b.0);
        }
        v.iter().map(|(_, key)| *key).collect()
    }

    #[test]
    fn small_results_keep_ties_in_key_order_both_ways() {
        // Keys 0..=4 written by one txn (mod revision 7), 5 and 6 later, 7 earlier.
        let items = [
            (7, 0),
            (7, 1),
            (7, 2),
            (7, 3),
            (7, 4),
            (8, 5),
            (9, 6),
            (3, 7),
        ];
        assert_eq!(sorted(&items, false), [7, 0, 1, 2, 3, 4, 5, 6]);
        // Descending: ties stay in key order; reversing an ascending sort would give 4..0.
        assert_eq!(sorted(&items, true), [6, 5, 0, 1, 2, 3, 4, 7]);
    }

    #[test]
    fn larger_results_place_ties_exactly_as_etcd_does() {
        // 20 keys put by one txn with these values, read back by etcd 3.4.23 (Debian's, built
        // with Go 1.19.8) with `etcdctl get --prefix --sort-by=VALUE --order=...`: the key
        // order it answered. Neither is the stable order.
        let values = [2, 0, 1, 1, 2, 0, 0, 2, 1, 0, 2, 2, 1, 0, 1, 2, 0, 1, 2, 1];
        let items: Vec<(i64, u32)> = values.iter().zip(0..).map(|(v, k)| (*v, k)).collect();
        assert_eq!(
            sorted(&items, false),
            [
                9, 1, 5, 6, 13, 16, 2, 3, 19, 17, 8, 14, 12, 10, 11, 15, 0, 7, 18, 4
            ]
        );
        assert_eq!(
            sorted(&items, true),
            [
                15, 10, 0, 11, 4, 7, 18, 14, 19, 17, 8, 3, 12, 2, 5, 13, 16, 9, 6, 1
            ]
        );
    }

    #[test]
    fn every_length_sorts_and_only_ties_move() {
        // A fixed pseudo-random sequence with many ties, at every length up to 300: the
        // result is ordered, a permutation, and up to 12 elements stable.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            state ^= state << 7;
            state ^= state >> 9;
            state
        };
        for n in 0..300u32 {
            let items: Vec<(i64, u32)> = (0..n).map(|k| ((next() % 5) as i64, k)).collect();
            for descending in [false, true] {
                let keys = sorted(&items, descending);
                let fields: Vec<i64> = keys.iter().map(|k| items[*k as usize].0).collect();
                let mut expected = fields.clone();
                expected.sort_unstable();
                if descending {
                    expected.reverse();
                }
                assert_eq!(fields, expected, "n={n} descending={descending}");
                let mut seen = keys.clone();
                seen.sort_unstable();
                assert_eq!(seen, (0..n).collect::<Vec<_>>());
                if n <= INSERTION_MAX as u32 {
                    let mut stable = items.clone();
                    stable.sort_by(|a, b| {
                        if descending {
                            b.0.cmp(&a.0)
                        } else {
                            a.0.cmp(&b.0)
                        }
                    });
                    let stable: Vec<u32> = stable.iter().map(|(_, k)| *k).collect();
                    assert_eq!(keys, stable, "n={n} descending={descending}");
                }
            }
        }
    }

    #[test]
    fn heapsort_fallback_and_pattern_breaking_still_sort() {
        // An organ-pipe sequence makes partitions unbalanced, so pattern breaking and, with
        // the allowance spent, heapsort run.
        let n = 2_000u32;
        let items: Vec<(i64, u32)> = (0..n)
            .map(|k| (i64::from(k.min(n - 1 - k) % 7), k))
            .collect();
        let keys = sorted(&items, false);
        let fields: Vec<i64> = keys.iter().map(|k| items[*k as usize].0).collect();
        assert!(fields.windows(2).all(|w| w[0] <= w[1]));
    }
}
