//! Where an answer's text may be cut to be spoken: clause, words and sentence ends.

/// Where the first clause of `text` ends (after its punctuation and the space that follows),
/// if it is complete: a sentence end or a line break, or a comma-like pause after 40 bytes.
pub(crate) fn clause_end(text: &str) -> Option<usize> {
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next = chars.peek().map(|(_, n)| *n);
        let strong = matches!(c, '.' | '!' | '?' | '\n');
        let weak = matches!(c, ',' | ';' | ':') && i >= 40;
        if (strong || weak) && next.is_some_and(char::is_whitespace) && text[..i].chars().any(char::is_alphanumeric) {
            let (j, n) = chars.next()?;
            return Some(j + n.len_utf8());
        }
    }
    None
}

/// Where the answer's first piece of about `n` words ends in `text`: before the word that
/// follows its `n`th word, once that word has begun (the space stays with the piece), or `None`
/// before that, or when `n` is 0. A piece does not end on a short function word ("The capital
/// of" goes on to "France"), for at most `n` more words. A word holds a letter or a digit ("-"
/// is not one); text without spaces is never cut.
pub(crate) fn words_end(text: &str, n: u32) -> Option<usize> {
    const FUNCTION: &[&str] = &[
        "a", "an", "the", "of", "to", "in", "on", "at", "for", "with", "and", "or", "but", "from", "by", "as", "into",
        "than", "that", "my", "your", "its", "their", "our", "his", "her",
    ];
    let n = n as usize;
    if n == 0 {
        return None;
    }
    let (mut count, mut last) = (0, "");
    for word in text.split_whitespace().filter(|w| w.chars().any(char::is_alphanumeric)) {
        if count >= n && (!FUNCTION.iter().any(|f| f.eq_ignore_ascii_case(last)) || count >= 2 * n) {
            return Some(word.as_ptr() as usize - text.as_ptr() as usize);
        }
        count += 1;
        last = word.trim_matches(|c: char| !c.is_alphanumeric());
    }
    None
}

/// Whether `text` ends a sentence as it stands: a full stop, question or exclamation mark right
/// after a word of two letters or more ("Paris.", not "3." of "3.5" nor "Dr." or "e.g.").
pub(crate) fn sentence_ended(text: &str) -> bool {
    let text = text.trim_end_matches(['"', '\'', ')']);
    let Some(body) = text.strip_suffix(['.', '!', '?']) else { return false };
    let word: String = body.chars().rev().take_while(|c| c.is_alphanumeric() || *c == '.').collect();
    let word: String = word.chars().rev().collect();
    let letters = word.chars().filter(|c| c.is_alphabetic()).count();
    let abbreviation = ["Mr", "Mrs", "Ms", "Dr", "St", "vs", "etc", "Prof", "Jr", "Sr", "No"].contains(&word.as_str());
    letters >= 2 && word.chars().all(char::is_alphabetic) && !abbreviation
}

#[cfg(test)]
mod tests {
    use super::{clause_end, sentence_ended, words_end};

    #[test]
    fn the_first_words_end_once_the_next_word_begins() {
        assert_eq!(words_end("The capital of France is", 4), Some(22));
        assert_eq!(&"The capital of France is"[..22], "The capital of France ");
        assert_eq!(words_end("The capital of France", 4), None, "France may go on");
        assert_eq!(words_end("The capital of France ", 4), None);
        assert_eq!(words_end("One - two three four five", 4), Some(21), "a dash is not a word");
        assert_eq!(words_end("One two three four five", 0), None);
        assert_eq!(words_end("", 4), None);
        assert_eq!(words_end(" Paris is", 1), Some(7), "leading space");
        assert_eq!(words_end("... It is 3.5 km", 3), Some(14), "numbers are words");
        assert_eq!(words_end("Été est chaud ici", 3), Some(16), "letters beyond ASCII");
        assert_eq!(words_end("巴黎是法国的首都", 1), None, "no spaces: never cut");
    }

    #[test]
    fn the_first_piece_does_not_end_on_a_function_word() {
        let t = "Yes, the capital of France is Paris.";
        assert_eq!(&t[..words_end(t, 4).unwrap()], "Yes, the capital of France ");
        assert_eq!(words_end("Yes, the capital of", 4), None);
        // At most n more words: "of the" twice, then cut anyway.
        let t = "one two of the of the of the";
        assert_eq!(&t[..words_end(t, 3).unwrap()], "one two of the of the ");
    }

    #[test]
    fn a_sentence_ends_at_its_mark_after_a_word() {
        assert!(sentence_ended("The capital of France is Paris."));
        assert!(sentence_ended("Is it hot?"));
        assert!(sentence_ended("He said \"yes.\""));
        assert!(!sentence_ended("It costs 3."), "3.5 may follow");
        assert!(!sentence_ended("Ask Dr."));
        assert!(!sentence_ended("Fruit, e.g."));
        assert!(!sentence_ended("Paris"));
        assert!(!sentence_ended("The letter A."), "one letter: an initial, perhaps");
    }

    #[test]
    fn clauses_end_at_sentence_ends_and_long_pauses() {
        assert_eq!(clause_end("Hello there. How"), Some(13));
        assert_eq!(clause_end("Hello there."), None, "not sure yet: more may follow");
        assert_eq!(clause_end("It costs 3.5 euros"), None);
        assert_eq!(clause_end("Short, then"), None);
        let long = "In spring, Paris is usually mild and pleasant, with";
        assert_eq!(clause_end(long), Some(47), "after the comma and its space");
        assert_eq!(clause_end("... and"), None);
    }
}
