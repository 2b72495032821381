//! `--part I/N`: one of N independent parts of a job (a conversion's shards, an evaluation's or calibration's
//! chunks), the contiguous run of items it takes, the same arithmetic in every job and in `scripts/cluster/`.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Part `index` (1-based) of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Part {
    pub index: usize,
    pub count: usize,
}

impl FromStr for Part {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || format!("expected I/N with 1 ≤ I ≤ N (e.g. 2/8: the second of eight parts), got `{text}`");
        let (index, count) = text.split_once('/').ok_or_else(invalid)?;
        let index: usize = index.trim().parse().map_err(|_| invalid())?;
        let count: usize = count.trim().parse().map_err(|_| invalid())?;
        if index == 0 || count == 0 || index > count {
            return Err(invalid());
        }
        Ok(Part { index, count })
    }
}

impl fmt::Display for Part {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}/{}", self.index, self.count)
    }
}

impl Part {
    /// The single part of a job that is not split.
    pub const WHOLE: Part = Part { index: 1, count: 1 };

    /// The items of `total` this part takes: `[(I−1)·total/N, I·total/N)`, a contiguous run, the runs of all parts
    /// as even as whole items allow (lengths differ by at most one), in order, together covering every item once.
    pub fn range(&self, total: usize) -> Range<usize> {
        let start = (self.index - 1) * total / self.count;
        let end = self.index * total / self.count;
        start..end
    }

    /// Every part of this part's job, in order.
    pub fn siblings(&self) -> impl Iterator<Item = Part> {
        let count = self.count;
        (1..=count).map(move |index| Part { index, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_parse_and_print() {
        let part: Part = "2/3".parse().unwrap();
        assert_eq!(part, Part { index: 2, count: 3 });
        assert_eq!(part.to_string(), "2/3");
        for bad in ["0/3", "4/3", "3", "a/b", "1/0", ""] {
            assert!(bad.parse::<Part>().unwrap_err().contains("I/N"), "{bad}");
        }
    }

    #[test]
    fn the_parts_cover_every_item_once_in_order() {
        for total in 0..23 {
            for count in 1..9 {
                let mut next = 0;
                for part in (Part { index: 1, count }).siblings() {
                    let range = part.range(total);
                    assert_eq!(range.start, next);
                    assert!(range.len() <= total.div_ceil(count) && range.len() + 1 >= total / count);
                    next = range.end;
                }
                assert_eq!(next, total);
            }
        }
    }
}
