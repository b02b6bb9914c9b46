//! `$(VAR)` references in env values, commands and args, with the API's
//! rules: a reference to a known variable is replaced by its value, an
//! unknown one stays as written, `$$` is a literal `$` (so `$$(VAR)` gives
//! `$(VAR)`), and a `$` that starts no reference is kept.

/// Expands the `$(NAME)` references of `input`; `lookup` gives a variable's
/// value, `None` for an unknown one.
pub(crate) fn expand<'a>(input: &str, lookup: impl Fn(&str) -> Option<&'a str>) -> String {
    let bytes = input.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(bytes.len());
    let mut checkpoint = 0;
    let mut cursor = 0;
    // Set once a search found no ')' up to the end: later searches would
    // find none either, and skipping them keeps a value full of `$(`
    // linear rather than quadratic.
    let mut no_close_left = false;
    while cursor < bytes.len() {
        if bytes[cursor] == b'$' && cursor + 1 < bytes.len() {
            out.extend_from_slice(&bytes[checkpoint..cursor]);
            let rest = &bytes[cursor + 1..];
            // How many bytes after the '$' this construct uses.
            let used = match rest[0] {
                b'$' => {
                    out.push(b'$');
                    1
                }
                b'(' => match (!no_close_left)
                    .then(|| rest.iter().position(|&b| b == b')'))
                    .flatten()
                {
                    Some(close) => {
                        let name = &input[cursor + 2..cursor + 1 + close];
                        match lookup(name) {
                            Some(v) => out.extend_from_slice(v.as_bytes()),
                            None => out.extend_from_slice(&bytes[cursor..cursor + 2 + close]),
                        }
                        close + 1
                    }
                    // No closing parenthesis: kept as written.
                    None => {
                        no_close_left = true;
                        out.extend_from_slice(b"$(");
                        1
                    }
                },
                other => {
                    out.push(b'$');
                    out.push(other);
                    1
                }
            };
            cursor += used;
            checkpoint = cursor + 1;
        }
        cursor += 1;
    }
    out.extend_from_slice(&bytes[checkpoint.min(bytes.len())..]);
    // Only whole ranges of a valid string and ASCII were copied.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars() -> HashMap<&'static str, &'static str> {
        HashMap::from([
            ("VAR_A", "A"),
            ("VAR_B", "B"),
            ("VAR_C", "C"),
            ("VAR_REF", "$(VAR_A)"),
            ("VAR_EMPTY", ""),
            ("ü", "umlaut"),
        ])
    }

    #[test]
    fn the_api_rules() {
        let v = vars();
        let cases = [
            ("$(VAR_A)", "A"),
            ("___$(VAR_B)___", "___B___"),
            ("$(VAR_A)-$(VAR_A)", "A-A"),
            ("$(VAR_A)_$(VAR_B)_$(VAR_C)", "A_B_C"),
            ("f000-$$VAR_A", "f000-$VAR_A"),
            ("foo\\$(VAR_C)bar", "foo\\Cbar"),
            ("foo\\\\$(VAR_C)bar", "foo\\\\Cbar"),
            ("$$$(VAR_A)", "$A"),
            ("$$(VAR_A)", "$(VAR_A)"),
            ("$$$$(VAR_A)", "$$(VAR_A)"),
            ("$(VAR_DNE)", "$(VAR_DNE)"),
            ("$$(VAR_DNE)", "$(VAR_DNE)"),
            ("$(VAR_EMPTY)", ""),
            ("x$(VAR_EMPTY)y", "xy"),
            // A value is not expanded again.
            ("$(VAR_REF)", "$(VAR_A)"),
            // Incomplete or no references stay.
            ("$(VAR_A", "$(VAR_A"),
            ("$(", "$("),
            ("$()", "$()"),
            ("$", "$"),
            ("$$", "$"),
            ("$$$", "$$"),
            ("$$$$", "$$"),
            ("$VAR_A", "$VAR_A"),
            ("${VAR_A}", "${VAR_A}"),
            ("$(VAR_A)$", "A$"),
            ("$)", "$)"),
            ("($(VAR_A))", "(A)"),
            ("", ""),
            ("no refs", "no refs"),
            ("$(ü)-ü$ü", "umlaut-ü$ü"),
            ("$(VAR_A $(VAR_B)", "$(VAR_A $(VAR_B)"),
            ("$(VAR_A)$(VAR_B", "A$(VAR_B"),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, |n| v.get(n).copied()), want, "{input:?}");
        }
    }

    #[test]
    fn nested_parentheses_end_at_the_first_close() {
        let v = vars();
        // The name is everything up to the first ')': "VAR_A $(VAR_B" is
        // unknown, so the reference stays, and so does the rest.
        assert_eq!(
            expand("$(VAR_A $(VAR_B))", |n| v.get(n).copied()),
            "$(VAR_A $(VAR_B))"
        );
    }

    #[test]
    fn unclosed_references_stay_linear() {
        // Each "$(" without a ')' after it used to scan to the end again:
        // a value of them took quadratic time. The test only needs to end.
        let input = "$(".repeat(1 << 19);
        assert_eq!(expand(&input, |_| Some("x")), input);
        let input = format!("{}$(A)", "$(".repeat(1 << 10));
        assert_eq!(expand(&input, |_| None), input);
    }
}
