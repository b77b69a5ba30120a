//! Text from users' objects, certificates and the kubelet is cut before it goes into a status
//! or an Event, so their size stays bounded whatever those say.

/// `s` cut to at most `max` bytes at a character boundary, `...` marking the cut.
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_at_a_char_boundary_and_marks_the_cut() {
        let s = cut(&"é".repeat(800), 1024);
        assert!(s.len() <= 1024 && s.ends_with("..."), "{}", s.len());
        assert_eq!(cut("short", 1024), "short");
        assert_eq!(cut("abcdef", 5), "ab...");
    }
}
