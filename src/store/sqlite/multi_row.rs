//! Statements that write many rows at once: a batch of n rows runs as at most one statement
//! per chunk size (37 = 32 + 4 + 1) rather than n. For a lease row, a statement's fixed cost on
//! the writer — the cache look-up, binding, opening a cursor per index, halting — was about
//! as much as the row's own work (issue 35). Not for every table: a group row's own work is
//! most of its insert, and inserting new groups this way saved nothing measurable.

use rusqlite::{Statement, ToSql};

use crate::store::StoreError;

/// Rows one multi-row statement writes at once, largest first.
pub(super) const CHUNK_SIZES: [usize; 6] = [32, 16, 8, 4, 2, 1];

/// Runs `write(size, chunk)` over `items` cut into chunks of `CHUNK_SIZES`, in order; `size`
/// indexes `CHUNK_SIZES` (and the statements `per_chunk_size` built).
pub(super) fn in_chunks<T>(
    items: &[T],
    mut write: impl FnMut(usize, &[T]) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let mut rest = items;
    for (size, &rows) in CHUNK_SIZES.iter().enumerate() {
        while rest.len() >= rows {
            let (chunk, tail) = rest.split_at(rows);
            write(size, chunk)?;
            rest = tail;
        }
    }
    Ok(())
}

/// `({lead}?{first}, …), ({lead}…)`: `rows` tuples of `width` numbered parameters each, from
/// `first` on, each tuple opening with `lead`.
pub(super) fn values_rows(rows: usize, width: usize, first: usize, lead: &str) -> String {
    let tuples: Vec<String> = (0..rows)
        .map(|row| {
            let params: Vec<String> = (0..width)
                .map(|column| format!("?{}", first + row * width + column))
                .collect();
            format!("({lead}{})", params.join(", "))
        })
        .collect();
    tuples.join(", ")
}

/// One statement per `CHUNK_SIZES` entry, built from `sql(rows)`.
pub(super) fn per_chunk_size(sql: fn(usize) -> String) -> Vec<String> {
    CHUNK_SIZES.iter().map(|&rows| sql(rows)).collect()
}

/// Binds `values` to the parameters from `at` on, moving `at` past them.
pub(super) fn bind_row(
    statement: &mut Statement<'_>,
    at: &mut usize,
    values: &[&dyn ToSql],
) -> rusqlite::Result<()> {
    for value in values {
        statement.raw_bind_parameter(*at, value)?;
        *at += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_cut_into_chunks_largest_first_in_order() {
        let items: Vec<usize> = (0..37).collect();
        let mut seen = Vec::new();
        in_chunks(&items, |size, chunk| {
            assert_eq!(chunk.len(), CHUNK_SIZES[size]);
            seen.push(chunk.to_vec());
            Ok(())
        })
        .expect("written");
        let sizes: Vec<usize> = seen.iter().map(Vec::len).collect();
        assert_eq!(sizes, [32, 4, 1]);
        assert_eq!(seen.concat(), items);
        in_chunks(&[] as &[usize], |_, _| panic!("nothing to write")).expect("empty");
    }

    #[test]
    fn values_are_numbered_row_after_row() {
        assert_eq!(values_rows(2, 2, 2, "?1, "), "(?1, ?2, ?3), (?1, ?4, ?5)");
        assert_eq!(values_rows(1, 3, 1, ""), "(?1, ?2, ?3)");
    }
}
