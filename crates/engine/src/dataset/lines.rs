//! Splitting a file into lines the way the reference's `for line in open(path)` does.

/// The file's lines as `(1-based number, bytes without the line ending)`.
///
/// Python opens text files with universal newlines, so `\n`, `\r\n` and a lone `\r` all end a
/// line; counting the same way keeps our line numbers equal to the reference's (and to editors').
pub(super) fn numbered_lines(bytes: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let mut rest = bytes;
    let mut number = 0;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        number += 1;
        let end = rest.iter().position(|&b| b == b'\n' || b == b'\r').unwrap_or(rest.len());
        let line = &rest[..end];
        let ending = match rest.get(end..end + 2) {
            Some(b"\r\n") => 2,
            _ if end < rest.len() => 1,
            _ => 0,
        };
        rest = &rest[end + ending..];
        Some((number, line))
    })
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

    #[test]
    fn universal_newlines_number_lines_like_python() {
        let lines: Vec<_> = numbered_lines(b"a\r\nb\rc\n\nd").collect();
        let expected: Vec<(usize, &[u8])> = vec![(1, b"a"), (2, b"b"), (3, b"c"), (4, b""), (5, b"d")];
        assert_eq!(lines, expected);
    }

    #[test]
    fn final_newline_does_not_add_a_line() {
        assert_eq!(numbered_lines(b"a\n").count(), 1);
        assert_eq!(numbered_lines(b"").count(), 0);
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
