//! Values that must never be printed.

use std::fmt;

/// A secret string (password, access key secret, token).
///
/// `Debug` and `Display` print `***`; only [`Secret::expose`] gives the value, and callers must
/// never log what it returns.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value. Never log or print it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Removes every occurrence of this secret from `text` (for error messages that might
    /// quote a value, such as a URL with a password).
    pub fn redact_in(&self, text: &str) -> String {
        if self.0.is_empty() {
            text.to_string()
        } else {
            text.replace(&self.0, "***")
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints_the_value() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?} {s}"), "*** ***");
        assert_eq!(s.expose(), "hunter2");
        assert_eq!(s.redact_in("user:hunter2@host"), "user:***@host");
    }
}
