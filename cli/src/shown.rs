//! Text from outside (a trace line, a file name, the target of a symbolic
//! link) made safe to echo in a message: every character a terminal would
//! act on or draw nothing for is written as its Rust escape (`\u{1b}`,
//! `\u{200b}`), so a message never moves the cursor, recolours the
//! terminal or says "'0' is not a whole number" with nothing visibly
//! wrong.
//!
//! Invariants: escaping is idempotent (an escape is plain visible text, so
//! escaping a message twice changes nothing); [`printable`] bounds what it
//! echoes, so a message built from a few echoed pieces stays short and
//! keeps its advice, which comes last.

use std::path::Path;

/// How many characters of one echoed piece [`printable`] keeps.
pub const ECHO_CHARS: usize = 120;

/// `text` as it may be echoed in a message: escaped (see [`push_shown`])
/// and cut after [`ECHO_CHARS`] characters, the cut marked `...`.
///
/// ```
/// assert_eq!(plugio_cli::shown::printable("a\u{1b}[31mb"), "a\\u{1b}[31mb");
/// assert_eq!(plugio_cli::shown::printable(&"x".repeat(200)).len(), 123);
/// ```
pub fn printable(text: &str) -> String {
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n == ECHO_CHARS {
            out.push_str("...");
            break;
        }
        push_shown(&mut out, c);
    }
    out
}

/// `text` escaped like [`printable`], never cut: for a piece the message
/// needs whole, such as a file name.
///
/// ```
/// assert_eq!(plugio_cli::shown::text("t\u{1b}.csv"), "t\\u{1b}.csv");
/// ```
pub fn text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        push_shown(&mut out, c);
    }
    out
}

/// A path as it may be echoed in a message: [`text`] of its name, each
/// byte that is not part of UTF-8 shown as `\x` and two hex digits, so two
/// names that differ only there are told apart (U+FFFD made them alike).
///
/// ```
/// use std::ffi::OsStr;
/// use std::os::unix::ffi::OsStrExt;
/// use std::path::Path;
/// assert_eq!(plugio_cli::shown::path(Path::new("/tmp/a\nb")), "/tmp/a\\nb");
/// let latin1 = Path::new(OsStr::from_bytes(b"caf\xe9.db"));
/// assert_eq!(plugio_cli::shown::path(latin1), "caf\\xe9.db");
/// ```
pub fn path(p: &Path) -> String {
    use std::fmt::Write;
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for chunk in p.as_os_str().as_bytes().utf8_chunks() {
        out.push_str(&text(chunk.valid()));
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// A whole message as it may reach the terminal: escaped like
/// [`printable`] except for its line breaks (`\n`), never cut. The last
/// guard before stderr, for a piece a message forgot to escape.
///
/// ```
/// assert_eq!(plugio_cli::shown::message("a\u{7}\nb"), "a\\u{7}\nb");
/// ```
pub fn message(m: &str) -> String {
    let mut out = String::with_capacity(m.len());
    for c in m.chars() {
        if c == '\n' {
            out.push(c);
        } else {
            push_shown(&mut out, c);
        }
    }
    out
}

/// `text` without its control characters and those that draw nothing:
/// what a reader sees, to tell a field spoiled by a zero-width space or a
/// byte-order mark from a wrong one.
///
/// ```
/// assert_eq!(plugio_cli::shown::visible("op\u{200b}"), "op");
/// ```
pub fn visible(text: &str) -> String {
    text.chars()
        .filter(|&c| !c.is_control() && !draws_nothing(c))
        .collect()
}

/// Pushes `c` onto a message, escaped (`\u{feff}`) when a terminal would
/// act on it or not show it: a control character, or one that draws
/// nothing (see [`draws_nothing`]).
pub fn push_shown(out: &mut String, c: char) {
    if c.is_control() || draws_nothing(c) {
        out.extend(c.escape_default());
    } else {
        out.push(c);
    }
}

/// True for a character a terminal draws nothing for, or that has no
/// meaning in text: Unicode's Default_Ignorable_Code_Point (byte-order
/// mark, soft hyphen, zero-width spaces and joiners, bidi controls,
/// variation selectors, tag characters, the Hangul fillers;
/// DerivedCoreProperties.txt of Unicode 15.1); the rest of the format
/// characters (general category Cf: the Arabic and Syriac number signs,
/// the interlinear annotation marks U+FFF9..FFFB, the Egyptian hieroglyph
/// format controls U+13430..1343F); the 66 noncharacters (U+FDD0..FDEF
/// and the last two of every plane); and the line and paragraph
/// separators, which break a line without being control characters.
pub fn draws_nothing(c: char) -> bool {
    let u = c as u32;
    let noncharacter = (0xfdd0..=0xfdef).contains(&u) || u & 0xfffe == 0xfffe;
    noncharacter
        || matches!(c,
            '\u{00ad}' | '\u{034f}' | '\u{0600}'..='\u{0605}' | '\u{061c}' | '\u{06dd}'
            | '\u{070f}' | '\u{0890}'..='\u{0891}' | '\u{08e2}' | '\u{115f}'..='\u{1160}'
            | '\u{17b4}'..='\u{17b5}' | '\u{180b}'..='\u{180f}'
            | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}' | '\u{3164}' | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}' | '\u{ffa0}' | '\u{fff0}'..='\u{fffb}'
            | '\u{110bd}' | '\u{110cd}' | '\u{13430}'..='\u{1343f}'
            | '\u{1bca0}'..='\u{1bca3}' | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0000}'..='\u{e0fff}')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(c: char) -> String {
        let mut s = String::new();
        push_shown(&mut s, c);
        s
    }

    #[test]
    fn characters_that_draw_nothing_are_escaped_and_visible_ones_kept() {
        // One from each Default_Ignorable and Cf range, the noncharacters
        // of planes 0, 1 and 16, and the line and paragraph separators.
        for c in [
            '\u{ad}',
            '\u{34f}',
            '\u{600}',
            '\u{61c}',
            '\u{6dd}',
            '\u{70f}',
            '\u{890}',
            '\u{8e2}',
            '\u{115f}',
            '\u{17b4}',
            '\u{180e}',
            '\u{200d}',
            '\u{2028}',
            '\u{2029}',
            '\u{202e}',
            '\u{2065}',
            '\u{3164}',
            '\u{fdd0}',
            '\u{fdef}',
            '\u{fe0f}',
            '\u{feff}',
            '\u{ffa0}',
            '\u{fff0}',
            '\u{fff9}',
            '\u{fffb}',
            '\u{fffe}',
            '\u{ffff}',
            '\u{110bd}',
            '\u{13430}',
            '\u{1343f}',
            '\u{1bca0}',
            '\u{1d173}',
            '\u{1fffe}',
            '\u{e0001}',
            '\u{e007f}',
            '\u{e0fff}',
            '\u{10ffff}',
            '\u{7}',
            '\u{1b}',
            '\u{85}',
        ] {
            assert_eq!(shown(c), c.escape_default().to_string(), "{:#x}", c as u32);
        }
        for c in [
            'a',
            'é',
            '中',
            '\u{1f600}',
            '\u{2010}',
            '\u{fdcf}',
            '\u{fdf0}',
            '\u{fe10}',
            '\u{fffc}',
            '\u{fffd}',
            '\u{13440}',
            '\u{1fffd}',
            '\u{e1000}',
        ] {
            assert_eq!(shown(c), c.to_string(), "{:#x}", c as u32);
        }
    }

    #[test]
    fn escaping_twice_changes_nothing_and_printable_cuts_after_the_escape() {
        let raw = "a\u{1b}[2J\u{200b}\nb\\u{7}";
        let once = message(raw);
        assert_eq!(message(&once), once);
        assert_eq!(printable(&once), printable(raw));
        // A cut never splits an escape: each character is escaped whole.
        let long = "\u{7}".repeat(ECHO_CHARS + 5);
        let p = printable(&long);
        assert_eq!(p, format!("{}...", "\\u{7}".repeat(ECHO_CHARS)));
    }
}
