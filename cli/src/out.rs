//! Writing to stdout without ever panicking: `pinguard report | head` closes the pipe early.

use std::io::Write;

pub fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
}

/// Columns padded to their widest cell; `right` marks right-aligned columns.
pub fn table(rows: &[Vec<String>], right: &[bool]) -> String {
    let cols = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut s = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            let pad = widths[c] - cell.chars().count();
            let last = c + 1 == r.len();
            if right.get(c).copied().unwrap_or(false) {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                if !last {
                    line.push_str(&" ".repeat(pad));
                }
            }
            if !last {
                line.push_str("  ");
            }
        }
        s.push_str(line.trim_end());
        s.push('\n');
    }
    s
}

/// `1 allocation`, `3 allocations`: a count and its noun as a person writes them.
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_take_the_noun_their_number_needs() {
        assert_eq!(super::count(1u64, "process", "processes"), "1 process");
        assert_eq!(super::count(0u64, "process", "processes"), "0 processes");
        assert_eq!(
            super::count(2u32, "allocation", "allocations"),
            "2 allocations"
        );
    }
}
