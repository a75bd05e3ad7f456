//! `awa.callback_contract`'s native half: signing, checking and URL building from
//! `awa_core::callback_contract`, under awa-pg's names (`sign_callback`, `verify_callback`,
//! `build_callback_url` and the `CALLBACK_*` constants), so the Python module and
//! `awa callbacks serve` share one implementation with the engine.

use awa_core::callback_contract as contract;
use pyo3::prelude::*;

/// A wrong-length secret is bad input: `awa.ValidationError`, which is also the `ValueError`
/// awa-pg raises, with awa-pg's message.
fn secret_error(e: contract::SecretLength) -> PyErr {
    crate::errors::ValidationError::new_err(e.to_string())
}

/// The `X-Awa-Signature` of `callback_id` under a 32-byte secret: lowercase hex of its BLAKE3
/// keyed hash.
#[pyfunction]
fn sign_callback(secret: &[u8], callback_id: &str) -> PyResult<String> {
    contract::sign(secret, callback_id).map_err(secret_error)
}

/// Whether `signature` (hex, either case) is `callback_id`'s signature; constant-time.
#[pyfunction]
fn verify_callback(secret: &[u8], callback_id: &str, signature: &str) -> PyResult<bool> {
    contract::verify(secret, callback_id, signature).map_err(secret_error)
}

/// `<base>/<prefix>/<callback_id>/<action>` with the slashes normalized.
#[pyfunction]
fn build_callback_url(base: &str, prefix: &str, callback_id: &str, action: &str) -> String {
    contract::build_callback_url(base, prefix, callback_id, action)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sign_callback, m)?)?;
    m.add_function(wrap_pyfunction!(verify_callback, m)?)?;
    m.add_function(wrap_pyfunction!(build_callback_url, m)?)?;
    m.add("CALLBACK_SIGNATURE_HEADER", contract::SIGNATURE_HEADER)?;
    m.add(
        "CALLBACK_DEFAULT_PATH_PREFIX",
        contract::DEFAULT_PATH_PREFIX,
    )?;
    m.add(
        "CALLBACK_DEFAULT_HEARTBEAT_TIMEOUT_SECS",
        contract::DEFAULT_HEARTBEAT_TIMEOUT_SECS,
    )?;
    Ok(())
}
