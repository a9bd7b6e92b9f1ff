//! The live records of one ledger shard: an open-addressing table keyed by address, with linear
//! probing and deletion by backward shift.
//!
//! A general hash map costs about twice the instructions per insert and remove, and its
//! tombstones make a table that sees millions of allocate/release pairs rehash now and then.
//! Here a pair is a few probes into one array, and a removal leaves the table as if the key had
//! never been there. Key 0 marks an empty slot (no live record sits at address 0).

//!
//! The table lives in the arena (`arena`), so that the state file holds the live records: each
//! growth publishes the new table in the state's header (`dir`), after it is filled, and a record
//! is written before its key, so that a reader of a dead process's file never takes a half-written
//! record for a live one.

use std::mem::MaybeUninit;
use std::sync::atomic::{compiler_fence, Ordering};

#[repr(C)]
struct Slot<V> {
    key: usize,
    val: MaybeUninit<V>,
}

pub struct AddrMap<V: Copy> {
    /// A power of two long (or empty): `cap` slots, in the arena or on the heap.
    slots: *mut Slot<V>,
    cap: usize,
    len: usize,
    /// Which entry of the state header's table directory names this table (`usize::MAX`: none).
    dir: usize,
}

// SAFETY: the map owns its slots exclusively (no aliasing pointer escapes); moving it between
// threads moves that ownership, as for a `Vec`.
unsafe impl<V: Copy + Send> Send for AddrMap<V> {}

impl<V: Copy> Default for AddrMap<V> {
    fn default() -> Self {
        AddrMap::EMPTY
    }
}

/// Spreads addresses (16-byte aligned, often page-aligned) over the table; a multiplier other
/// than the ledger's shard hash, so that the keys of one shard do not bunch up.
#[inline(always)]
fn hash(key: usize) -> usize {
    ((key as u64 >> 4).wrapping_mul(0xD6E8_FEB8_6659_FD93) >> 24) as usize
}

impl<V: Copy> AddrMap<V> {
    pub const EMPTY: Self = AddrMap {
        slots: std::ptr::null_mut(),
        cap: 0,
        len: 0,
        dir: usize::MAX,
    };

    /// An empty map whose tables the state header names in its entry `dir`.
    pub const fn in_state(dir: usize) -> Self {
        AddrMap {
            slots: std::ptr::null_mut(),
            cap: 0,
            len: 0,
            dir,
        }
    }

    #[inline(always)]
    fn slot(&self, i: usize) -> &Slot<V> {
        debug_assert!(i < self.cap);
        // SAFETY: `i` is masked to `cap - 1` by every caller, and `slots` holds `cap` slots.
        unsafe { &*self.slots.add(i) }
    }

    #[inline(always)]
    fn slot_mut(&mut self, i: usize) -> &mut Slot<V> {
        debug_assert!(i < self.cap);
        // SAFETY: as in `slot`, and `&mut self` makes the access exclusive.
        unsafe { &mut *self.slots.add(i) }
    }

    /// Fills slot `i`: the record first, then its key (a reader of the state file takes a slot
    /// with a key for a whole record).
    #[inline(always)]
    fn put(&mut self, i: usize, key: usize, val: V) {
        let s = self.slot_mut(i);
        s.val = MaybeUninit::new(val);
        compiler_fence(Ordering::Release);
        s.key = key;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.cap.wrapping_sub(1)
    }

    /// The slot holding `key`, or the empty slot where it would go.
    #[inline(always)]
    fn find(&self, key: usize) -> usize {
        let mask = self.mask();
        let mut i = hash(key) & mask;
        loop {
            let k = self.slot(i).key;
            if k == key || k == 0 {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    /// Inserts or replaces; returns the value replaced.
    #[inline(always)]
    pub fn insert(&mut self, key: usize, val: V) -> Option<V> {
        debug_assert_ne!(key, 0);
        // Short of memory, the table fills further instead; the last empty slot ends every
        // search, so a table that could not grow drops the record (`heap` counted the refusal).
        if (self.len + 1) * 4 > self.cap * 3 && !self.grow() && self.len + 2 > self.cap {
            return None;
        }
        let i = self.find(key);
        let s = self.slot_mut(i);
        if s.key == 0 {
            self.put(i, key, val);
            self.len += 1;
            None
        } else {
            // SAFETY: a slot with its key set holds an initialised value; `V: Copy`.
            let old = unsafe { s.val.assume_init() };
            // Emptied while rewritten: a reader of a dead process's state never counts a torn record.
            s.key = 0;
            compiler_fence(Ordering::Release);
            self.put(i, key, val);
            Some(old)
        }
    }

    pub fn get(&self, key: usize) -> Option<&V> {
        if self.len == 0 || key == 0 {
            return None;
        }
        let s = self.slot(self.find(key));
        // SAFETY: a slot whose key is set always holds an initialised value (`insert`, `delete`, `grow`).
        (s.key == key).then(|| unsafe { s.val.assume_init_ref() })
    }

    /// Removes `key` if `accept` takes its value.
    pub fn remove_if(&mut self, key: usize, accept: impl FnOnce(&V) -> bool) -> Option<V> {
        if self.len == 0 || key == 0 {
            return None;
        }
        let i = self.find(key);
        if self.slot(i).key != key {
            return None;
        }
        // SAFETY: the key matched, so the slot holds an initialised value; `V: Copy`, so reading it
        // leaves the slot intact.
        let v = unsafe { self.slot(i).val.assume_init() };
        if !accept(&v) {
            return None;
        }
        self.delete(i);
        Some(v)
    }

    /// Empties slot `i` and moves later entries of its run back, so that every key stays
    /// reachable from its home slot without crossing an empty one.
    fn delete(&mut self, mut i: usize) {
        let mask = self.mask();
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let k = self.slot(j).key;
            if k == 0 {
                break;
            }
            let home = hash(k) & mask;
            // The entry at j may move to i unless its home lies cyclically in (i, j].
            let stays = if i <= j {
                i < home && home <= j
            } else {
                i < home || home <= j
            };
            if !stays {
                // Moved before the old slot is emptied: a reader of a dead process's state may
                // see it twice (and keeps one), never not at all.
                let v = self.slot(j).val;
                self.slot_mut(i).key = 0;
                compiler_fence(Ordering::Release);
                // SAFETY: slot j's key is set, so its value is initialised; `V: Copy`.
                self.put(i, k, unsafe { v.assume_init() });
                i = j;
            }
        }
        self.slot_mut(i).key = 0;
        self.len -= 1;
    }

    /// Doubles the table; false (the table unchanged) when no memory could be had for it.
    #[cold]
    fn grow(&mut self) -> bool {
        let cap = (self.cap * 2).max(16);
        let bytes = cap * std::mem::size_of::<Slot<V>>();
        // 64-byte aligned: the state's directory keeps the capacity in the address's low bits;
        // 128: no other data shares its lines (or their prefetched pairs) with a table written on
        // every call.
        let new = crate::accounting::arena::alloc(bytes, 128).unwrap_or_else(|| {
            let Ok(layout) =
                std::alloc::Layout::from_size_align(bytes, std::mem::align_of::<Slot<V>>())
            else {
                return std::ptr::null_mut();
            };
            // SAFETY: a non-zero size; all-zero slots are empty slots.
            unsafe { std::alloc::alloc_zeroed(layout) }
        }) as *mut Slot<V>;
        if new.is_null() {
            return false;
        }
        let (old, old_cap) = (self.slots, self.cap);
        self.slots = new;
        self.cap = cap;
        for i in 0..old_cap {
            // SAFETY: the old table holds `old_cap` slots and is not freed until the end.
            let s = unsafe { &*old.add(i) };
            if s.key != 0 {
                let j = self.find(s.key);
                // SAFETY: a slot with its key set holds an initialised value; `V: Copy`.
                self.put(j, s.key, unsafe { s.val.assume_init() });
            }
        }
        if self.dir != usize::MAX {
            crate::accounting::arena::publish_table(self.dir, new as usize, cap);
        }
        if !old.is_null() {
            let old_bytes = old_cap * std::mem::size_of::<Slot<V>>();
            if crate::accounting::arena::holds(old as *const u8) {
                crate::accounting::arena::give_back(old as *mut u8, old_bytes);
            } else {
                let layout =
                    std::alloc::Layout::from_size_align(old_bytes, std::mem::align_of::<Slot<V>>())
                        .expect("a table's layout");
                // SAFETY: allocated above with this layout (on the heap: not in the arena).
                unsafe { std::alloc::dealloc(old as *mut u8, layout) };
            }
        }
        true
    }

    pub fn iter(&self) -> impl Iterator<Item = (usize, &V)> {
        // SAFETY: only slots with a key set pass the filter, and those hold initialised values.
        (0..self.cap)
            .map(|i| self.slot(i))
            .filter(|s| s.key != 0)
            .map(|s| (s.key, unsafe { s.val.assume_init_ref() }))
    }

    /// Forgets every record without giving its table back: a fork child's tables belong to the
    /// parent's state, which the child lets go of.
    pub fn forget(&mut self) {
        *self = AddrMap {
            dir: self.dir,
            ..AddrMap::EMPTY
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn agrees_with_a_hash_map_through_random_inserts_and_removals() {
        let mut m: AddrMap<u64> = AddrMap::default();
        let mut model: HashMap<usize, u64> = HashMap::new();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few distinct keys, page- and 16-byte-aligned, so runs form and wrap around.
            let key = ((x % 3000) as usize + 1) * if x & 1 == 0 { 4096 } else { 16 };
            match x % 5 {
                0 | 1 => {
                    m.insert(key, step);
                    model.insert(key, step);
                }
                2 => assert_eq!(m.remove_if(key, |_| true), model.remove(&key)),
                3 => {
                    let odd = |v: &u64| v % 2 == 1;
                    let want = model.get(&key).copied().filter(odd);
                    if want.is_some() {
                        model.remove(&key);
                    }
                    assert_eq!(m.remove_if(key, odd), want);
                }
                _ => assert_eq!(m.get(key), model.get(&key)),
            }
            assert_eq!(m.len(), model.len());
        }
        let mut all: Vec<_> = m.iter().map(|(k, v)| (k, *v)).collect();
        let mut want: Vec<_> = model.into_iter().collect();
        all.sort();
        want.sort();
        assert_eq!(all, want);
    }

    #[test]
    fn a_full_run_that_wraps_the_table_end_still_finds_every_key() {
        let mut m: AddrMap<usize> = AddrMap::default();
        let mask = 15;
        // Keys whose home is the last slot, so their run wraps to the start.
        let keys: Vec<usize> = (1..100_000usize)
            .map(|k| k * 16)
            .filter(|&k| hash(k) & mask == mask)
            .take(5)
            .collect();
        for &k in &keys {
            m.insert(k, k);
        }
        assert_eq!(m.remove_if(keys[0], |_| true), Some(keys[0]));
        for &k in &keys[1..] {
            assert_eq!(m.get(k), Some(&k));
        }
        assert_eq!(m.get(keys[0]), None);
    }
}
