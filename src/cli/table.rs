//! Plain-text tables for human reports: left-aligned first column, right-aligned numbers.

pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Self { header: header.iter().map(|h| h.to_string()).collect(), rows: Vec::new() }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths = vec![0; columns];
        for row in std::iter::once(&self.header).chain(&self.rows) {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let line =
            |row: &Vec<String>| {
                row.iter()
                    .enumerate()
                    .map(|(i, cell)| {
                        if i == 0 {
                            format!("{cell:<w$}", w = widths[i])
                        } else {
                            format!("{cell:>w$}", w = widths[i])
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("  ")
            };
        let mut text = line(&self.header);
        text.push('\n');
        text.push_str(&widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("  "));
        for row in &self.rows {
            text.push('\n');
            text.push_str(&line(row));
        }
        text
    }
}
