//! Splitting a file into lines the way the reference's `for line in open(path)` does.

use std::collections::VecDeque;
use std::io::{self, BufRead};

/// The lines of `reader` as `(1-based number, bytes without the line ending)`, read one at a time
/// so that memory follows the longest line, not the file.
///
/// Python opens text files with universal newlines, so `\n`, `\r\n` and a lone `\r` all end a
/// line; counting the same way keeps our line numbers equal to the reference's (and to editors').
pub(super) fn numbered_lines(mut reader: impl BufRead) -> impl Iterator<Item = io::Result<(usize, Vec<u8>)>> {
    let mut number = 0;
    // Lines split off a chunk at lone `\r`s, waiting to be handed out.
    let mut pending: VecDeque<Vec<u8>> = VecDeque::new();
    std::iter::from_fn(move || loop {
        if let Some(line) = pending.pop_front() {
            number += 1;
            return Some(Ok((number, line)));
        }
        let mut chunk = Vec::new();
        match reader.read_until(b'\n', &mut chunk) {
            Ok(0) => return None,
            Ok(_) => pending.extend(split_chunk(chunk)),
            Err(error) => return Some(Err(error)),
        }
    })
}

/// The lines in one `read_until('\n')` chunk: it ends at a `\n` (or at the end of the file) and
/// may hold lone `\r`s, each of which ends a line too.
fn split_chunk(mut chunk: Vec<u8>) -> Vec<Vec<u8>> {
    let ended = chunk.last() == Some(&b'\n');
    if ended {
        chunk.pop();
        if chunk.last() == Some(&b'\r') {
            chunk.pop();
        }
    }
    if !chunk.contains(&b'\r') {
        return vec![chunk];
    }
    let mut lines: Vec<Vec<u8>> = chunk.split(|&b| b == b'\r').map(<[u8]>::to_vec).collect();
    // A lone `\r` at the very end of the file ends its line; nothing follows it.
    if !ended && lines.last().is_some_and(Vec::is_empty) {
        lines.pop();
    }
    lines
}

/// Python's `str.isspace`: Unicode `White_Space` plus the information separators U+001C..U+001F,
/// which Python counts as whitespace and Rust's `char::is_whitespace` does not.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `line.strip()`, also returning how many characters were removed in front (so error
/// columns can point into the file's line rather than the stripped text).
pub(super) fn python_strip(line: &str) -> (usize, &str) {
    let trimmed_start = line.trim_start_matches(is_python_space);
    let leading = line[..line.len() - trimmed_start.len()].chars().count();
    (leading, trimmed_start.trim_end_matches(is_python_space))
}

/// The 1-based character column of the byte at 1-based byte column `byte_column` of `text`.
pub(super) fn char_column(text: &str, byte_column: usize) -> usize {
    let prefix = text.as_bytes().get(..byte_column).unwrap_or(text.as_bytes());
    // Counting bytes that start a character counts the characters that begin in the prefix,
    // even when `byte_column` falls inside a multi-byte character.
    prefix.iter().filter(|&&b| b & 0xC0 != 0x80).count().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(bytes: &[u8]) -> Vec<(usize, Vec<u8>)> {
        numbered_lines(bytes).map(Result::unwrap).collect()
    }

    #[test]
    fn universal_newlines_number_lines_like_python() {
        let expected: Vec<(usize, Vec<u8>)> =
            [(1, "a"), (2, "b"), (3, "c"), (4, ""), (5, "d")].map(|(n, l)| (n, l.as_bytes().to_vec())).to_vec();
        assert_eq!(lines(b"a\r\nb\rc\n\nd"), expected);
        // `\r` then `\r\n` is two line endings, as Python reads it.
        assert_eq!(lines(b"a\r\r\nb"), vec![(1, b"a".to_vec()), (2, Vec::new()), (3, b"b".to_vec())]);
    }

    #[test]
    fn final_newline_does_not_add_a_line() {
        assert_eq!(lines(b"a\n").len(), 1);
        assert_eq!(lines(b"a\r").len(), 1);
        assert_eq!(lines(b"a\r\n").len(), 1);
        assert_eq!(lines(b"").len(), 0);
    }

    #[test]
    fn strip_removes_python_whitespace_only() {
        assert_eq!(python_strip("\u{1f}\u{a0} x y\u{3000}\t"), (3, "x y"));
        assert_eq!(python_strip("\u{feff}x"), (0, "\u{feff}x"));
    }

    #[test]
    fn char_column_counts_characters() {
        assert_eq!(char_column("café!", 6), 5);
        assert_eq!(char_column("café!", 4), 4);
        assert_eq!(char_column("ab", 0), 1);
        assert_eq!(char_column("ab", 9), 2);
    }
}
