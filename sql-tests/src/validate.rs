//! Comparing results: token by token, numbers within a tolerance.
//!
//! Reference answers come from another engine (DuckDB), whose types differ from DataFusion's
//! in the last digits: an average of DECIMAL(15,2) is a double in DuckDB and DECIMAL(19,6) in
//! DataFusion. Numbers therefore match when they differ by at most 1e-6 absolutely or 1e-9
//! relatively; everything else must be equal.

use sqllogictest::Normalizer;

/// Whether two tokens are equal, numbers within tolerance.
pub fn tokens_match(actual: &str, expected: &str) -> bool {
    if actual == expected {
        return true;
    }
    match (actual.parse::<f64>(), expected.parse::<f64>()) {
        (Ok(a), Ok(e)) if looks_numeric(actual) && looks_numeric(expected) => {
            let diff = (a - e).abs();
            diff <= 1.5e-6 || diff <= 1e-9 * e.abs().max(a.abs())
        }
        _ => false,
    }
}

fn looks_numeric(s: &str) -> bool {
    s.chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '-' | '+' | '.' | 'e' | 'E'))
}

/// sqllogictest validator: rows joined by spaces, compared token by token.
pub fn tolerant_validator(
    normalizer: Normalizer,
    actual: &[Vec<String>],
    expected: &[String],
) -> bool {
    let actual: Vec<String> = actual.iter().map(|r| r.join(" ")).collect();
    let expected: Vec<String> = expected.iter().map(normalizer).collect();
    if actual.len() != expected.len() {
        return false;
    }
    actual.iter().zip(&expected).all(|(a, e)| {
        let a: Vec<&str> = a.split_whitespace().collect();
        let e: Vec<&str> = e.split_whitespace().collect();
        a.len() == e.len() && a.iter().zip(&e).all(|(a, e)| tokens_match(a, e))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerance() {
        assert!(tokens_match("0.047758", "0.04775862069"));
        assert!(tokens_match("380456", "380456"));
        assert!(!tokens_match("380456", "380457"));
        assert!(tokens_match("56586554400.73", "56586554400.73"));
        assert!(!tokens_match("abc", "abd"));
        assert!(!tokens_match("1992-01-01", "1992-01-02"));
    }
}
