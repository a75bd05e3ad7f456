//! Kind derivation: a job's kind defaults to its args type name in snake_case.
//!
//! Acronyms stay together (`SMTPEmail` → `smtp_email`, `HTMLToPDF` → `html_to_pdf`), which is
//! what users of awa-pg already see in their tables, so the same rule lives here once and the
//! Python package calls it through the native module.

/// Convert a CamelCase type name into the snake_case kind.
pub fn derive_kind(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_uppercase() {
            let prev = if i > 0 { Some(chars[i - 1]) } else { None };
            let next = chars.get(i + 1).copied();
            let boundary = match prev {
                None => false,
                Some('_') => false,
                Some(p) if p.is_lowercase() || p.is_ascii_digit() => true,
                // Inside an acronym: split only before the last capital that starts a word.
                Some(p) if p.is_uppercase() => next.is_some_and(|n| n.is_lowercase()),
                Some(_) => false,
            };
            if boundary {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::derive_kind;

    #[test]
    fn derives_snake_case_keeping_acronyms() {
        for (name, kind) in [
            ("SendEmail", "send_email"),
            ("SMTPEmail", "smtp_email"),
            ("HTMLToPDF", "html_to_pdf"),
            ("StageA", "stage_a"),
            ("Job", "job"),
            ("already_snake", "already_snake"),
            ("ResizeImage2X", "resize_image2_x"),
            ("IOError", "io_error"),
        ] {
            assert_eq!(derive_kind(name), kind, "{name}");
        }
    }
}
