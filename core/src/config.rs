//! Configuration: what every crate's sections share.
//!
//! Each section of the file is a type of the crate it configures (serde types with
//! unknown fields refused, every field with a default, and a `validate` that names the
//! bad field with `INVALID_CONFIG`); the whole document, `PaddockConfig`, is the
//! `paddock` crate's. This module holds the loading machinery they share
//! ([`from_toml`], [`from_json`], [`check_env_names`]) and [`LimitsConfig`], which
//! every layer reads.

pub use crate::tenancy::LimitsConfig;

use serde::de::DeserializeOwned;

use crate::error::{Error, ErrorCode, Result};

/// Parses a TOML document into a configuration type: any parse error (a bad value, an
/// unknown key) is `INVALID_CONFIG`, with the byte where it was found. The type's
/// own `validate` is not called.
pub fn from_toml<T: DeserializeOwned>(text: &str) -> Result<T> {
    toml::from_str(text).map_err(|e| {
        let span = e
            .span()
            .map(|s| format!(" (at byte {})", s.start))
            .unwrap_or_default();
        Error::new(
            ErrorCode::InvalidConfig,
            format!("{}{span}", e.message().trim()),
        )
    })
}

/// Parses a JSON document into a configuration type: any parse error is
/// `INVALID_CONFIG`. The type's own `validate` is not called.
pub fn from_json<T: DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| Error::new(ErrorCode::InvalidConfig, e.to_string()))
}

/// Refuses names that cannot be environment variable names (empty, or with `=` or NUL),
/// naming `field`.
pub fn check_env_names(field: &str, names: &[String]) -> Result<()> {
    for name in names {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(Error::invalid_config(
                field,
                format!("`{name}` is not a valid variable name"),
            ));
        }
    }
    Ok(())
}
