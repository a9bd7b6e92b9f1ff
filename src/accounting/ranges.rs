//! Locked page ranges with the kernel's semantics: locking a locked page adds nothing, unlocking
//! or unmapping removes exactly the pages covered, and a partial unlock splits a range.

use smallvec::SmallVec;
use std::collections::BTreeMap;

/// What `gaps` answers: almost always one or two ranges, kept off the heap (an `mlock` loop must
/// not allocate on every call).
pub type Gaps = SmallVec<[(usize, usize); 4]>;

/// The parts of `[start, end)` that no span of `covered` covers; `covered` is sorted by start,
/// and its spans may overlap each other and reach outside `[start, end)`.
pub fn uncovered(
    start: usize,
    end: usize,
    covered: impl IntoIterator<Item = (usize, usize)>,
) -> Gaps {
    let mut gaps = Gaps::new();
    let mut cur = start;
    for (s, e) in covered.into_iter().take_while(|&(s, _)| s < end) {
        if s > cur {
            gaps.push((cur, s));
        }
        cur = cur.max(e);
    }
    if cur < end {
        gaps.push((cur, end));
    }
    gaps
}

/// The whole pages `[addr, addr + len)` touches, as the kernel rounds them; `None` if it wraps.
pub fn page_span(addr: usize, len: usize, page: usize) -> Option<(usize, usize)> {
    let start = addr & !(page - 1);
    let end = addr.checked_add(len)?.checked_add(page - 1)? & !(page - 1);
    Some((start, end))
}

/// Ranges by start: a sorted vector while there are few (a look-up, insert or removal is a
/// binary search and a short move, where a B-tree costs a few hundred instructions: an `mlock`
/// loop pays that on every call), a B-tree once there are many.
enum Store<T> {
    Few(Vec<(usize, (usize, T))>),
    Many(BTreeMap<usize, (usize, T)>),
}

/// A walk over a `Store`'s ranges, without a box (nothing allocates on the way).
enum Iter<'a, T> {
    Few(std::slice::Iter<'a, (usize, (usize, T))>),
    Many(std::collections::btree_map::Range<'a, usize, (usize, T)>),
}

impl<'a, T> Iterator for Iter<'a, T> {
    type Item = (usize, &'a (usize, T));

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Few(i) => i.next().map(|(k, r)| (*k, r)),
            Iter::Many(i) => i.next().map(|(&k, r)| (k, r)),
        }
    }
}

/// Past this many ranges the sorted vector becomes a B-tree (its moves grow with its length).
const FEW: usize = 32;

impl<T> Store<T> {
    /// The range with the largest start below `x`.
    #[inline]
    fn last_below(&self, x: usize) -> Option<(usize, &(usize, T))> {
        match self {
            Store::Few(v) => {
                let i = v.partition_point(|r| r.0 < x);
                i.checked_sub(1).map(|i| (v[i].0, &v[i].1))
            }
            Store::Many(m) => m.range(..x).next_back().map(|(&k, r)| (k, r)),
        }
    }

    /// The range with the largest start at or below `x`.
    fn last_at_or_below(&self, x: usize) -> Option<(usize, &(usize, T))> {
        match x.checked_add(1) {
            Some(y) => self.last_below(y),
            None => self.iter().last(),
        }
    }

    /// The range with the smallest start in `[from, to)`.
    fn first_in(&self, from: usize, to: usize) -> Option<(usize, &(usize, T))> {
        self.range(from, to).next()
    }

    /// The ranges starting in `[from, to)`, in order.
    fn range(&self, from: usize, to: usize) -> Iter<'_, T> {
        let to = to.max(from);
        match self {
            Store::Few(v) => Iter::Few(
                v[v.partition_point(|r| r.0 < from)..v.partition_point(|r| r.0 < to)].iter(),
            ),
            Store::Many(m) => Iter::Many(m.range(from..to)),
        }
    }

    fn get(&self, k: usize) -> Option<&(usize, T)> {
        match self {
            Store::Few(v) => v.binary_search_by_key(&k, |r| r.0).ok().map(|i| &v[i].1),
            Store::Many(m) => m.get(&k),
        }
    }

    fn insert(&mut self, k: usize, r: (usize, T)) {
        match self {
            Store::Few(v) if v.len() < FEW => match v.binary_search_by_key(&k, |r| r.0) {
                Ok(i) => v[i].1 = r,
                Err(i) => v.insert(i, (k, r)),
            },
            Store::Few(v) => {
                let mut m: BTreeMap<usize, (usize, T)> = std::mem::take(v).into_iter().collect();
                m.insert(k, r);
                *self = Store::Many(m);
            }
            Store::Many(m) => {
                m.insert(k, r);
            }
        }
    }

    #[inline]
    fn remove(&mut self, k: usize) -> Option<(usize, T)> {
        match self {
            Store::Few(v) => v
                .binary_search_by_key(&k, |r| r.0)
                .ok()
                .map(|i| v.remove(i).1),
            Store::Many(m) => m.remove(&k),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Store::Few(v) => v.is_empty(),
            Store::Many(m) => m.is_empty(),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        match self {
            Store::Few(v) => v.len(),
            Store::Many(m) => m.len(),
        }
    }

    fn iter(&self) -> Iter<'_, T> {
        match self {
            Store::Few(v) => Iter::Few(v.iter()),
            Store::Many(m) => Iter::Many(m.range(..)),
        }
    }

    /// Empties the store, handing back what it held in order.
    fn take_all(&mut self) -> Vec<(usize, (usize, T))> {
        match std::mem::replace(self, Store::Few(Vec::new())) {
            Store::Few(v) => v,
            Store::Many(m) => m.into_iter().collect(),
        }
    }
}

/// The pieces `take` cut out: start, end, value.
pub type Pieces<T> = SmallVec<[(usize, usize, T); 4]>;

/// What a `RangeSet` held at one time (`RangeSet::stamp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp(u64, u64);

/// Disjoint ranges, each carrying who locked it.
pub struct RangeSet<T> {
    map: Store<T>,
    /// The bytes covered, kept so that comparing with the kernel's `VmLck` costs no walk.
    bytes: u64,
    /// Insertions so far. With `bytes` (which every removal lowers), the set's `stamp`.
    inserted: u64,
}

impl<T: Clone> Default for RangeSet<T> {
    fn default() -> Self {
        RangeSet {
            map: Store::Few(Vec::new()),
            bytes: 0,
            inserted: 0,
        }
    }
}

impl<T: Clone> RangeSet<T> {
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The bytes covered by every range together.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Differs after any insertion or removal: two equal stamps, the same set. An insertion moves
    /// `inserted`, and a removal lowers `bytes`, which only an insertion raises again: no
    /// count to keep on the removal paths (the `munlock` of a pair).
    pub fn stamp(&self) -> Stamp {
        Stamp(self.inserted, self.bytes)
    }

    /// A range touching `[start, end)`: the one ending at `start`, else the one starting at `end`.
    pub fn adjacent(&self, start: usize, end: usize) -> Option<&T> {
        match self.map.last_below(start) {
            Some((_, (e, v))) if *e == start => Some(v),
            _ => self.map.get(end).map(|(_, v)| v),
        }
    }

    /// The value of the range holding `addr`, if any.
    pub fn at(&self, addr: usize) -> Option<&T> {
        match self.map.last_at_or_below(addr) {
            Some((_, (e, v))) if *e > addr => Some(v),
            _ => None,
        }
    }

    /// The bytes of `[start, end)` the set covers.
    pub fn covered(&self, start: usize, end: usize) -> u64 {
        let free: usize = self.gaps(start, end).iter().map(|(s, e)| e - s).sum();
        (end - start - free) as u64
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The parts of `[start, end)` not yet in the set.
    pub fn gaps(&self, start: usize, end: usize) -> Gaps {
        let mut gaps = Gaps::new();
        // The usual case, one look-up: the last range starting before `end` ends by `start`, and
        // every earlier one ends before it starts, so nothing overlaps.
        match self.map.last_below(end) {
            None => {
                gaps.push((start, end));
                return gaps;
            }
            Some((_, &(e, _))) if e <= start => {
                gaps.push((start, end));
                return gaps;
            }
            _ => {}
        }
        // The range starting before `start` may cover its beginning.
        let before = self.map.last_below(start).map(|(s, &(e, _))| (s, e));
        uncovered(
            start,
            end,
            before
                .into_iter()
                .chain(self.map.range(start, end).map(|(s, &(e, _))| (s, e))),
        )
    }

    /// Adds a range that must not overlap the set (one of `gaps`' answers).
    pub fn insert(&mut self, start: usize, end: usize, v: T) {
        debug_assert!(start < end);
        debug_assert!(
            self.gaps(start, end)
                .iter()
                .map(|(s, e)| e - s)
                .sum::<usize>()
                == end - start
        );
        self.bytes += (end - start) as u64;
        self.inserted += 1;
        self.map.insert(start, (end, v));
    }

    /// Removes `[start, end)`; `f(value, bytes removed, change in range count)` is called per
    /// range touched (count -1: gone, 0: trimmed, +1: split in two).
    pub fn remove(&mut self, start: usize, end: usize, mut f: impl FnMut(&T, u64, i64)) {
        self.cut(start, end, |s, e, v, delta| f(v, (e - s) as u64, delta));
    }

    /// Removes `[start, end)` and hands back the pieces removed, each with its value (for a move:
    /// the kernel keeps the lock on pages `mremap` moves). `f` is called as in `remove`.
    pub fn take(&mut self, start: usize, end: usize, mut f: impl FnMut(&T, u64, i64)) -> Pieces<T> {
        let mut pieces = Pieces::new();
        self.cut(start, end, |s, e, v, delta| {
            f(v, (e - s) as u64, delta);
            pieces.push((s, e, v.clone()));
        });
        pieces
    }

    /// `f(piece start, piece end, value, change in range count)` per range touched.
    fn cut(&mut self, start: usize, end: usize, mut f: impl FnMut(usize, usize, &T, i64)) {
        let mut report = |bytes: &mut u64, s: usize, e: usize, v: &T, delta: i64| {
            *bytes -= (e - s) as u64;
            f(s, e, v, delta)
        };
        // The usual case: exactly one range, as it was locked; or nothing there at all.
        match self.map.last_below(end) {
            None => return,
            Some((_, &(e, _))) if e <= start => return,
            Some((s, &(e, _))) if s == start && e == end => {
                let (_, v) = self.map.remove(s).expect("key just found");
                report(&mut self.bytes, start, end, &v, -1);
                return;
            }
            _ => {}
        }
        let first = match self.map.last_below(start) {
            Some((s, &(e, _))) if e > start => s,
            _ => start,
        };
        let mut from = first;
        // One look-up per range touched rather than a list of keys: no allocation.
        while let Some(s) = (from < end)
            .then(|| self.map.first_in(from, end).map(|(k, _)| k))
            .flatten()
        {
            let (e, v) = self.map.remove(s).expect("key just found");
            from = e; // ranges are disjoint: the next one starts at or after this one's end
            let cut_s = s.max(start);
            let cut_e = e.min(end);
            let left = s < cut_s;
            let right = cut_e < e;
            if left {
                self.map.insert(s, (cut_s, v.clone()));
            }
            if right {
                self.map.insert(cut_e, (e, v.clone()));
            }
            let delta = left as i64 + right as i64 - 1;
            report(&mut self.bytes, cut_s, cut_e, &v, delta);
        }
    }

    /// Removes everything, reporting each range as in `remove`.
    pub fn clear(&mut self, mut f: impl FnMut(&T, u64, i64)) {
        self.bytes = 0;
        for (s, (e, v)) in self.map.take_all() {
            f(&v, (e - s) as u64, -1);
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (usize, usize, &T)> {
        self.map.iter().map(|(s, (e, v))| (s, *e, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const PAGE: usize = 4096;

    fn total(r: &RangeSet<u8>) -> usize {
        r.iter().map(|(s, e, _)| e - s).sum()
    }

    #[test]
    fn union_split_and_unmap() {
        let mut r = RangeSet::<u8>::default();
        assert_eq!(r.gaps(0x1000, 0x5000).to_vec(), vec![(0x1000, 0x5000)]);
        r.insert(0x1000, 0x5000, 1);
        // Overlapping lock: only the uncovered tail is new.
        assert_eq!(r.gaps(0x3000, 0x8000).to_vec(), vec![(0x5000, 0x8000)]);
        r.insert(0x5000, 0x8000, 2);
        assert_eq!(
            r.gaps(0x0, 0x9000).to_vec(),
            vec![(0x0, 0x1000), (0x8000, 0x9000)]
        );
        assert!(r.gaps(0x2000, 0x7000).is_empty());
        // Unlock in the middle of the first range splits it.
        let mut seen = Vec::new();
        r.remove(0x2000, 0x3000, |v, b, d| seen.push((*v, b, d)));
        assert_eq!(seen, vec![(1, 0x1000, 1)]);
        assert_eq!(total(&r), 0x6000);
        assert_eq!(r.len(), 3);
        // Unmap across two ranges trims one, removes part of the other.
        seen.clear();
        r.remove(0x4000, 0x6000, |v, b, d| seen.push((*v, b, d)));
        assert_eq!(seen, vec![(1, 0x1000, 0), (2, 0x1000, 0)]);
        assert_eq!(total(&r), 0x4000);
        seen.clear();
        r.remove(0, usize::MAX, |v, b, d| seen.push((*v, b, d)));
        assert_eq!(seen.iter().map(|s| s.1).sum::<u64>(), 0x4000);
        assert_eq!(seen.iter().map(|s| s.2).sum::<i64>(), -3);
        assert!(r.is_empty());
    }

    #[test]
    fn locks_and_unlocks_agree_with_a_page_map() {
        // Few ranges (the sorted vector), then many short ones (past `FEW`: the B-tree).
        assert!(agree_with_a_page_map(64, 64, 1) <= FEW);
        assert!(agree_with_a_page_map(1024, 4, 3) > FEW);
    }

    /// Random locks and unlocks of up to `max_len` pages among `pages`, `locks` in `locks + 1`
    /// of them locks, checked against a page map; returns the most ranges the set held.
    fn agree_with_a_page_map(pages: usize, max_len: usize, locks: u64) -> usize {
        let mut r = RangeSet::<u8>::default();
        let mut model = vec![false; pages];
        let mut most = 0;
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let s = (x % pages as u64) as usize;
            let e = (s + 1 + ((x >> 8) % max_len as u64) as usize).min(pages);
            if !(x >> 20).is_multiple_of(locks + 1) {
                // Lock: the gaps are exactly the pages not yet locked.
                let gaps = r.gaps(s * PAGE, e * PAGE);
                let new: usize = gaps.iter().map(|(gs, ge)| (ge - gs) / PAGE).sum();
                assert_eq!(new, model[s..e].iter().filter(|p| !**p).count());
                for (gs, ge) in gaps {
                    r.insert(gs, ge, 0);
                }
                model[s..e].iter_mut().for_each(|p| *p = true);
            } else {
                let mut removed = 0;
                r.remove(s * PAGE, e * PAGE, |_, bytes, _| {
                    removed += bytes as usize / PAGE
                });
                assert_eq!(removed, model[s..e].iter().filter(|p| **p).count());
                model[s..e].iter_mut().for_each(|p| *p = false);
            }
            assert_eq!(total(&r) / PAGE, model.iter().filter(|p| **p).count());
            assert_eq!(r.bytes() as usize, total(&r));
            let probe = ((x >> 32) % pages as u64) as usize;
            assert_eq!(r.at(probe * PAGE + 1).is_some(), model[probe]);
            assert_eq!(
                r.covered(s * PAGE, e * PAGE) as usize / PAGE,
                model[s..e].iter().filter(|p| **p).count()
            );
            most = most.max(r.len());
        }
        most
    }

    #[test]
    fn bytes_neighbours_and_moves() {
        let mut r = RangeSet::<u8>::default();
        r.insert(0x1000, 0x3000, 1);
        r.insert(0x3000, 0x4000, 2);
        r.insert(0x8000, 0x9000, 3);
        assert_eq!(r.bytes(), 0x4000);
        assert_eq!(r.at(0x2fff), Some(&1));
        assert_eq!(r.at(0x3000), Some(&2));
        assert_eq!(r.at(0x4000), None);
        assert_eq!(r.adjacent(0x4000, 0x5000), Some(&2));
        assert_eq!(r.adjacent(0x7000, 0x8000), Some(&3));
        assert_eq!(r.adjacent(0x5000, 0x6000), None);
        assert_eq!(r.covered(0x0, 0x10000), 0x4000);
        assert_eq!(r.covered(0x2000, 0x8800), 0x2800);
        // A move takes the pieces with their owners, clipped to the range.
        let mut seen = Vec::new();
        let pieces = r.take(0x2000, 0x3800, |v, b, d| seen.push((*v, b, d)));
        assert_eq!(
            pieces.to_vec(),
            vec![(0x2000, 0x3000, 1), (0x3000, 0x3800, 2)]
        );
        assert_eq!(seen, vec![(1, 0x1000, 0), (2, 0x800, 0)]);
        assert_eq!(r.bytes(), 0x4000 - 0x1800);
        r.clear(|_, _, _| {});
        assert_eq!(r.bytes(), 0);
    }

    #[test]
    fn the_stamp_moves_with_every_change_and_only_then() {
        let mut r = RangeSet::<u8>::default();
        let mut last = r.stamp();
        let mut moved = |r: &RangeSet<u8>| {
            let m = r.stamp() != last;
            last = r.stamp();
            m
        };
        r.insert(0x1000, 0x3000, 1);
        assert!(moved(&r), "insert");
        r.remove(0x5000, 0x6000, |_, _, _| {});
        assert!(!moved(&r), "a removal of nothing the set holds");
        let _ = r.gaps(0, 0x10000);
        assert!(!moved(&r), "a look");
        r.remove(0x1000, 0x3000, |_, _, _| {});
        assert!(moved(&r), "a removal of a whole range");
        r.insert(0x1000, 0x3000, 1);
        moved(&r);
        r.remove(0x2000, 0x2800, |_, _, _| {});
        assert!(moved(&r), "a split");
        r.insert(0x2000, 0x2800, 2);
        assert!(moved(&r), "the same bytes again, elsewhere");
        r.clear(|_, _, _| {});
        assert!(moved(&r), "clear");
    }

    #[test]
    fn pages() {
        assert_eq!(page_span(0x1001, 1, 0x1000), Some((0x1000, 0x2000)));
        assert_eq!(page_span(0x1000, 0x1000, 0x1000), Some((0x1000, 0x2000)));
        assert_eq!(page_span(0x1fff, 2, 0x1000), Some((0x1000, 0x3000)));
        assert_eq!(page_span(usize::MAX - 10, 100, 0x1000), None);
    }
}
