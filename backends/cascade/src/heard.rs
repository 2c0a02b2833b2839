//! What Whisper heard, made into the user's words: its non-speech tags and its repetitions
//! left out.

/// What Whisper heard, without its non-speech tags (`[BLANK_AUDIO]`, `(music)`) and without a
/// sentence repeated right after itself (Whisper's repetition on short audio: "What do bees
/// make? What do bees make?"); empty when no word is left.
pub(crate) fn words(heard: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in heard.chars() {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    let out = once(&out.split_whitespace().collect::<Vec<_>>().join(" "));
    if out.chars().any(|c| c.is_alphanumeric()) { out } else { String::new() }
}

/// `text` with each sentence that repeats the one before it (letters and digits compared,
/// case aside) left out.
fn once(text: &str) -> String {
    let key = |s: &str| s.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect::<String>();
    let mut out = String::new();
    let mut last = String::new();
    let mut rest = text;
    while !rest.is_empty() {
        let end = rest.find(['.', '?', '!']).map_or(rest.len(), |i| i + 1);
        let (sentence, after) = rest.split_at(end);
        let k = key(sentence);
        if k.is_empty() || k != last {
            out.push_str(sentence);
        }
        if !k.is_empty() {
            last = k;
        }
        rest = after;
    }
    out.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::words;

    #[test]
    fn whispers_non_speech_tags_are_not_words() {
        assert_eq!(words(" [BLANK_AUDIO]"), "");
        assert_eq!(words(" What (music) is  it?"), "What is it?");
        assert_eq!(words("(sighs) ..."), "", "no word left");
        assert_eq!(words(" What do bees make? What do bees make?"), "What do bees make?");
        assert_eq!(words("Yes. No. Yes."), "Yes. No. Yes.", "only a sentence right after itself");
        assert_eq!(words("What color is it? what colour is it"), "What color is it? what colour is it");
    }
}
