//! Errors on one line, with their causes.
//!
//! Errors keep their inner error as `#[source]` instead of repeating it in
//! `Display` (STYLE.md, errors), so whoever logs or shows one must walk the
//! chain; this is the one walk every crate uses.

use std::error::Error;

/// The error and each of its sources, outermost first.
pub fn error_sources<'a>(err: &'a (dyn Error + 'a)) -> impl Iterator<Item = &'a (dyn Error + 'a)> {
    std::iter::successors(Some(err), |&e: &&'a (dyn Error + 'a)| {
        e.source().map(|s| s as &(dyn Error + 'a))
    })
}

/// The error and its sources on one line, `outer: inner: innermost`.
pub fn error_chain(err: &(dyn Error + '_)) -> String {
    error_sources(err)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner")]
    struct Inner(#[source] std::fmt::Error);

    #[test]
    fn the_chain_is_outermost_first_on_one_line() {
        let err = Outer(Inner(std::fmt::Error));
        assert_eq!(error_chain(&err), format!("outer: inner: {}", std::fmt::Error));
        assert_eq!(error_sources(&err).count(), 3);
        assert_eq!(error_chain(&std::fmt::Error), std::fmt::Error.to_string());
    }
}
