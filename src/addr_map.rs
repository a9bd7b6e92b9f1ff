//! The live records of one ledger shard: an open-addressing table keyed by address, with linear
//! probing and deletion by backward shift.
//!
//! A general hash map costs about twice the instructions per insert and remove, and its
//! tombstones make a table that sees millions of allocate/release pairs rehash now and then.
//! Here a pair is a few probes into one array, and a removal leaves the table as if the key had
//! never been there. Key 0 marks an empty slot (no live record sits at address 0).

use std::mem::MaybeUninit;

struct Slot<V> {
    key: usize,
    val: MaybeUninit<V>,
}

pub struct AddrMap<V: Copy> {
    /// A power of two long (or empty).
    slots: Vec<Slot<V>>,
    len: usize,
}

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
    pub const EMPTY: Self = AddrMap { slots: Vec::new(), len: 0 };

    pub fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// The slot holding `key`, or the empty slot where it would go.
    #[inline(always)]
    fn find(&self, key: usize) -> usize {
        let mask = self.mask();
        let mut i = hash(key) & mask;
        loop {
            let k = self.slots[i].key;
            if k == key || k == 0 {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    /// Inserts or replaces; returns the value replaced.
    pub fn insert(&mut self, key: usize, val: V) -> Option<V> {
        debug_assert_ne!(key, 0);
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let i = self.find(key);
        let s = &mut self.slots[i];
        let old = if s.key == 0 {
            s.key = key;
            self.len += 1;
            None
        } else {
            // SAFETY: a slot with its key set holds an initialised value, moved out here and
            // overwritten below.
            Some(unsafe { s.val.assume_init_read() })
        };
        s.val = MaybeUninit::new(val);
        old
    }

    pub fn get(&self, key: usize) -> Option<&V> {
        if self.len == 0 || key == 0 {
            return None;
        }
        let s = &self.slots[self.find(key)];
        // SAFETY: a slot whose key is set always holds an initialised value (`insert`, `delete`, `grow`).
        (s.key == key).then(|| unsafe { s.val.assume_init_ref() })
    }

    /// Removes `key` if `accept` takes its value.
    pub fn remove_if(&mut self, key: usize, accept: impl FnOnce(&V) -> bool) -> Option<V> {
        if self.len == 0 || key == 0 {
            return None;
        }
        let i = self.find(key);
        if self.slots[i].key != key {
            return None;
        }
        // SAFETY: the key matched, so the slot holds an initialised value; `V: Copy`, so reading it
        // leaves the slot intact.
        let v = unsafe { self.slots[i].val.assume_init() };
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
            let k = self.slots[j].key;
            if k == 0 {
                break;
            }
            let home = hash(k) & mask;
            // The entry at j may move to i unless its home lies cyclically in (i, j].
            let stays = if i <= j { i < home && home <= j } else { i < home || home <= j };
            if !stays {
                self.slots[i].key = k;
                self.slots[i].val = self.slots[j].val;
                i = j;
            }
        }
        self.slots[i].key = 0;
        self.len -= 1;
    }

    fn grow(&mut self) {
        let cap = (self.slots.len() * 2).max(16);
        let old = std::mem::replace(&mut self.slots, (0..cap).map(|_| Slot { key: 0, val: MaybeUninit::uninit() }).collect());
        for s in old.iter().filter(|s| s.key != 0) {
            let i = self.find(s.key);
            self.slots[i] = Slot { key: s.key, val: s.val };
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (usize, &V)> {
        // SAFETY: only slots with a key set pass the filter, and those hold initialised values.
        self.slots.iter().filter(|s| s.key != 0).map(|s| (s.key, unsafe { s.val.assume_init_ref() }))
    }

    pub fn clear(&mut self) {
        *self = AddrMap::default();
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
        let keys: Vec<usize> = (1..100_000usize).map(|k| k * 16).filter(|&k| hash(k) & mask == mask).take(5).collect();
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
