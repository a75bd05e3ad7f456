//! A small finite set with the value semantics of a TLA+ set.

use std::fmt;

/// A finite set kept as a sorted vector: cheap to clone and hash for the
/// handful of elements a model state holds.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Set<T>(Vec<T>);

impl<T: Ord> Set<T> {
    pub const fn new() -> Self {
        Set(Vec::new())
    }

    /// Adds `x`; adding an element already present changes nothing.
    pub fn insert(&mut self, x: T) {
        if let Err(at) = self.0.binary_search(&x) {
            self.0.insert(at, x);
        }
    }

    pub fn remove(&mut self, x: &T) {
        if let Ok(at) = self.0.binary_search(x) {
            self.0.remove(at);
        }
    }

    pub fn contains(&self, x: &T) -> bool {
        self.0.binary_search(x).is_ok()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<T: Ord> Default for Set<T> {
    fn default() -> Self {
        Set::new()
    }
}

impl<T: Ord> FromIterator<T> for Set<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut set = Set::new();
        for x in iter {
            set.insert(x);
        }
        set
    }
}

impl<'a, T> IntoIterator for &'a Set<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<T: fmt::Debug> fmt::Debug for Set<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(&self.0).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::Set;

    #[test]
    fn behaves_as_a_set() {
        let mut s: Set<u8> = [3, 1, 3, 2].into_iter().collect();
        assert_eq!(s.iter().copied().collect::<Vec<_>>(), [1, 2, 3]);
        s.insert(2);
        assert_eq!(s.len(), 3);
        s.remove(&1);
        s.remove(&7);
        assert!(!s.contains(&1) && s.contains(&3));
        let t: Set<u8> = [3, 2].into_iter().collect();
        assert_eq!(s, t);
    }
}
